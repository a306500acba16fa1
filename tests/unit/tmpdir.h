/* tmpdir — one fresh temporary directory per test program, and paths in it: tmpdir_make at the
 * start of main, path_in(NAME) for a file in it (four results stay valid at once), tmpdir_remove at
 * the end. The directory's name is tmp_dir. */
#ifndef FSDP_TEST_TMPDIR_H
#define FSDP_TEST_TMPDIR_H

#include <stdio.h>
#include <stdlib.h>

static char tmp_dir[64];

/* /tmp/NAME.XXXXXX, made afresh; a test that cannot make it cannot run: it exits 1. */
static inline const char *tmpdir_make(const char *name) {
  snprintf(tmp_dir, sizeof tmp_dir, "/tmp/%s.XXXXXX", name);
  if (!mkdtemp(tmp_dir)) {
    perror("mkdtemp");
    exit(1);
  }
  return tmp_dir;
}

static inline const char *path_in(const char *name) {
  static char buf[4][256];
  static int k;
  char *p = buf[k++ & 3];
  snprintf(p, 256, "%s/%s", tmp_dir, name);
  return p;
}

static inline void tmpdir_remove(void) {
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp_dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmp_dir);
}

#endif
