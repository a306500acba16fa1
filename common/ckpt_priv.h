/* ckpt_priv — what ckpt.c (the rank files' writer, finding and pruning) and ckpt_manifest.c (the manifest)
 * share beside ckpt_rankfile.h, and the test hook worker/ckpt_async.c calls too. Not for other
 * modules: they use ckpt.h. */
#ifndef FSDP_CKPT_PRIV_H
#define FSDP_CKPT_PRIV_H

/* Where a test may hold a checkpoint writer (POINT: begin, mid, manifest; chunk: ckpt_async's
 * writer thread after each chunk, holding no lock). In fsdpd, fsdp-worker and
 * fsdpctl a no-op (ckpt.c's weak definition); the binaries built for tests link
 * tests/hooks/ckpt_pause.c instead, which holds it as FSDP_TEST_CKPT_PAUSE says. */
void ckpt_test_pause(const char *point, int step, int rank);

#endif
