/* ckpt_pause — the checkpoint writer's test hook, linked only into the binaries built for tests
 * (tests/CMakeLists.txt: test_ckpt_async, tests/fsdp-worker-hooks); fsdpd, fsdp-worker and fsdpctl
 * keep common/ckpt.c's weak no-op. Called on the writer's thread (the caller's, or ckpt_async's).
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ckpt_priv.h"
#include "envknob.h"

/* FSDP_TEST_CKPT_PAUSE = POINT:STEP, POINT one of begin, mid, manifest, chunk: the writer of
 * step STEP stops at POINT, creates FSDP_TEST_CKPT_PAUSE_DIR/paused-POINT-RANK and waits for
 * DIR/release (120 s at most), so that a test can kill a process at that very moment of a save. */
void ckpt_test_pause(const char *point, int step, int rank) {
  const char *want = envknob_get(ENV_TEST_CKPT_PAUSE), *dir = envknob_get(ENV_TEST_CKPT_PAUSE_DIR);
  char mine[64], path[PATH_MAX];
  snprintf(mine, sizeof mine, "%s:%d", point, step);
  if (!want || !dir || strcmp(want, mine) != 0) return;
  snprintf(path, sizeof path, "%s/paused-%s-%d", dir, point, rank);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  snprintf(path, sizeof path, "%s/release", dir);
  struct timespec t0, now, tick = {0, 10 * 1000 * 1000};
  clock_gettime(CLOCK_MONOTONIC, &t0);
  do {   /* polled: the release is a file another process creates */
    if (access(path, F_OK) == 0) return;
    nanosleep(&tick, NULL);
    clock_gettime(CLOCK_MONOTONIC, &now);
  } while (now.tv_sec - t0.tv_sec < 120);
}
