/* test_tokmask — masked token files: written and read back bit for bit (uint16 and uint32, counts
 * that are not a multiple of 8), opened by the training reader tok_open() as masked; plan's check
 * of a job's files (tokmask_check_files). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tmpdir.h"
#include "tokens.h"
#include "tokmask.h"

static void roundtrip(int vocab, int64_t n) {
  char name[64];
  snprintf(name, sizeof name, "m%d_%lld.bin", vocab, (long long)n);
  const char *path = path_in(name);
  uint32_t *t = malloc((size_t)n * 4 + 4);
  uint8_t *m = malloc((size_t)n + 1), *s = malloc((size_t)n + 1);
  for (int64_t i = 0; i < n; i++) {
    t[i] = (uint32_t)((i * 7919) % vocab);
    m[i] = (uint8_t)((i * 31 + 7) % 3 == 0);
    s[i] = (uint8_t)(i % 5 == 0);
  }
  CHECK_OK(tokmask_write(path, t, m, s, n, vocab));
  uint32_t *t2;
  uint8_t *m2, *s2;
  int64_t n2;
  CHECK_OK(tokmask_read(path, &t2, &m2, &s2, &n2));
  CHECK_EQ_INT(n, n2);
  if (n2 == n) {
    CHECK(!memcmp(t, t2, (size_t)n * 4));
    CHECK(!memcmp(m, m2, (size_t)n));
    CHECK(!memcmp(s, s2, (size_t)n));
  }
  /* the training reader opens it as masked, with the same tokens (test_tokrows reads its rows) */
  tok_file *f = NULL;
  CHECK_OK(tok_open(path, &f));
  CHECK(f && tok_masked(f) && tok_count(f) == n);
  tok_destroy(&f);
  free(t), free(m), free(s), free(t2), free(m2), free(s2);
}

int main(void) {
  tmpdir_make("test_tokmask");
  roundtrip(50257, 13);
  roundtrip(151936, 1000);
  roundtrip(300, 8);
  roundtrip(300, 0);
  /* a plain token file is not a masked one */
  const char *path = path_in("plain.bin");
  uint32_t one = 1;
  CHECK_OK(tok_write(path, &one, 1, 10));
  uint32_t *t;
  uint8_t *m, *s;
  int64_t n;
  CHECK(tokmask_read(path, &t, &m, &s, &n) == FSDP_ERR_FORMAT);
  CHECK(strstr(fsdp_last_error(), "has no loss mask") != NULL);
  /* plan, submit and run: pack = false needs documents; one stream does not mix the two kinds */
  const char *masked = path_in("m300_8.bin");
  CHECK_OK(tokmask_check_files("train", path, 1));
  CHECK_OK(tokmask_check_files("train", masked, 0));
  CHECK(tokmask_check_files("train", path, 0) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "[data] pack = false: train") && strstr(fsdp_last_error(), "plain token file"));
  char both[2048];
  snprintf(both, sizeof both, "%s\n%s", masked, path);
  CHECK(tokmask_check_files("val", both, 1) == FSDP_ERR_INVALID);
  CHECK(strstr(fsdp_last_error(), "[data] val:") && strstr(fsdp_last_error(), "all masked files"));
  CHECK(strchr(fsdp_last_error(), '\n') == NULL);
  tmpdir_remove();
  return check_done();
}
