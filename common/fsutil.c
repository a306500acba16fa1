/* fsutil — see fsutil.h. */
#define _GNU_SOURCE   /* nftw */
#include "fsutil.h"

#include <errno.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

fsdp_status fsutil_mkdir_p(const char *path, mode_t mode) {
  char tmp[PATH_MAX];
  if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
    return fsdp_set_error(FSDP_ERR_RANGE, "path %s is too long", path);
  for (char *p = tmp + 1; *p; p++) {
    if (*p != '/') continue;
    *p = '\0';
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
      return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
    *p = '/';
  }
  if (mkdir(tmp, mode) != 0 && errno != EEXIST)
    return fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  return FSDP_OK;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st;
  (void)flag;
  (void)ftw;
  remove(path);
  return 0;
}

void fsutil_remove_tree(const char *dir) { nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS); }
