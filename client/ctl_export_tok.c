/* ctl_export_tok — copies tokenizer files into an export folder (see ctl_export_tok.h). */
#include "ctl_export_tok.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bpe.h"

#define TOK_MAX_COPY ((size_t)1 << 30)   /* a tokenizer file is megabytes; refuse anything silly */

/* SRC read (as fsutil_open_read allows) and written new as NAME in OUT. MUST_LOAD: SRC is the
 * tokenizer.json, which must load. *ABSENT (when not NULL) says SRC does not exist, which is no error. */
static fsdp_status copy_file(const char *src, fsutil_out *out, const char *name, int must_load, int *absent) {
  char *text = NULL;
  size_t len = 0;
  fsdp_status rc = fsutil_read_all(AT_FDCWD, src, TOK_MAX_COPY, &text, &len);
  if (absent && (*absent = rc == FSDP_ERR_NOTFOUND)) return FSDP_OK;
  TRY(rc);
  if (must_load) {   /* refuse what neither sample nor gen-data could use */
    bpe_tokenizer *t = NULL;
    rc = bpe_load_json(text, len, src, &t);
    bpe_destroy(&t);
  }
  if (rc == FSDP_OK) rc = fsutil_out_write(out, name, text, len, 0644);
  free(text);
  return rc;
}

fsdp_status export_tokenizer(const char *src, fsutil_out *out, char *names, size_t n) {
  static const char *const extra[] = {"tokenizer_config.json", "special_tokens_map.json"};
  struct stat sb;
  char json[4096], path[4200];
  if (stat(src, &sb) != 0) return fsdp_set_error(FSDP_ERR_NOTFOUND, "tokenizer %s does not exist", src);
  int isdir = S_ISDIR(sb.st_mode);
  if (snprintf(json, sizeof json, isdir ? "%s/tokenizer.json" : "%s", src) >= (int)sizeof json)
    return fsdp_set_error(FSDP_ERR_RANGE, "the path %s is too long", src);
  TRY(copy_file(json, out, "tokenizer.json", 1, NULL));
  snprintf(names, n, "tokenizer.json");
  for (size_t i = 0; isdir && i < sizeof extra / sizeof *extra; i++) {
    int absent = 0;
    snprintf(path, sizeof path, "%s/%s", src, extra[i]);
    TRY(copy_file(path, out, extra[i], 0, &absent));
    if (absent) continue;
    size_t used = strlen(names);
    snprintf(names + used, n - used, ", %s", extra[i]);
  }
  return FSDP_OK;
}
