/* ctl_export_tok — copies tokenizer files into an export folder (see ctl_export_tok.h). */
#include "ctl_export_tok.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bpe.h"

/* SRC to DIR/NAME through DIR/NAME.tmp (O_EXCL | O_NOFOLLOW: no link is written through). */
static fsdp_status copy_file(const char *src, const char *dir, const char *name) {
  char dst[4096], tmp[4200];
  snprintf(dst, sizeof dst, "%s/%s", dir, name);
  snprintf(tmp, sizeof tmp, "%s.tmp", dst);
  int in = open(src, O_RDONLY | O_CLOEXEC);
  if (in < 0) return fsdp_set_error(FSDP_ERR_IO, "cannot read %s: %s", src, strerror(errno));
  unlink(tmp);
  int out = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  fsdp_status rc = FSDP_OK;
  if (out < 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot create %s: %s", tmp, strerror(errno));
  char buf[1 << 16];
  for (ssize_t k; rc == FSDP_OK && (k = read(in, buf, sizeof buf)) != 0;) {
    if (k < 0 || write(out, buf, (size_t)k) != k) rc = fsdp_set_error(FSDP_ERR_IO, "cannot copy %s to %s: %s", src, tmp, strerror(errno));
  }
  if (rc == FSDP_OK && fsync(out) != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
  if (out >= 0 && close(out) != 0 && rc == FSDP_OK) rc = fsdp_set_error(FSDP_ERR_IO, "cannot write %s: %s", tmp, strerror(errno));
  close(in);
  if (rc == FSDP_OK && rename(tmp, dst) != 0) rc = fsdp_set_error(FSDP_ERR_IO, "cannot rename %s: %s", tmp, strerror(errno));
  if (rc != FSDP_OK && out >= 0) unlink(tmp);
  return rc;
}

fsdp_status export_tokenizer(const char *src, const char *outdir, char *names, size_t n) {
  static const char *const extra[] = {"tokenizer_config.json", "special_tokens_map.json"};
  struct stat sb;
  char json[4096], path[4200];
  if (stat(src, &sb) != 0) return fsdp_set_error(FSDP_ERR_NOTFOUND, "tokenizer %s: %s", src, strerror(errno));
  int isdir = S_ISDIR(sb.st_mode);
  snprintf(json, sizeof json, isdir ? "%s/tokenizer.json" : "%s", src);
  bpe_tokenizer *t = NULL;
  TRY(bpe_load(json, &t));   /* refuse what neither sample nor gen-data could use */
  bpe_destroy(&t);
  TRY(copy_file(json, outdir, "tokenizer.json"));
  snprintf(names, n, "tokenizer.json");
  for (size_t i = 0; isdir && i < sizeof extra / sizeof *extra; i++) {
    snprintf(path, sizeof path, "%s/%s", src, extra[i]);
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    TRY(copy_file(path, outdir, extra[i]));
    size_t used = strlen(names);
    snprintf(names + used, n - used, ", %s", extra[i]);
  }
  return FSDP_OK;
}
