/* tokmask — masked token files (see tokmask.h). */
#include "tokmask.h"

#include <errno.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fsutil.h"
#include "tokens.h"

static int put_bits(FILE *fp, const uint8_t *v, int64_t n) {
  uint8_t buf[4096];
  for (int64_t i = 0; i < n; i += 8 * (int64_t)sizeof buf) {
    int64_t m = n - i < 8 * (int64_t)sizeof buf ? n - i : 8 * (int64_t)sizeof buf;
    size_t nb = (size_t)((m + 7) / 8);
    memset(buf, 0, nb);
    for (int64_t j = 0; j < m; j++)
      if (v[i + j]) buf[j / 8] |= (uint8_t)(1u << (j % 8));
    if (fwrite(buf, 1, nb, fp) != nb) return 0;
  }
  return 1;
}

fsdp_status tokmask_write(const char *path, const uint32_t *tokens, const uint8_t *mask, const uint8_t *starts,
                          int64_t n, int vocab) {
  if (vocab < 1) return fsdp_set_error(FSDP_ERR_RANGE, "tokmask_write: vocab %d; must be at least 1", vocab);
  if (n < 0 || n > INT32_MAX)
    return fsdp_set_error(FSDP_ERR_RANGE, "%lld tokens; a token file holds 0 to %d", (long long)n, INT32_MAX);
  for (int64_t i = 0; i < n; i++)
    if (tokens[i] >= (uint32_t)vocab)
      return fsdp_set_error(FSDP_ERR_RANGE, "token %u at position %lld is >= vocab %d", tokens[i], (long long)i, vocab);
  int wide = vocab > 65536;
  int32_t hdr[TOK_HEADER_INTS] = {0};
  hdr[0] = wide ? TOK_MAGIC_U32 : TOK_MAGIC_U16;
  hdr[1] = wide ? TOK_VERSION_U32_MASKED : TOK_VERSION_U16_MASKED;
  hdr[2] = (int32_t)n;
  fsutil_atomic at = FSUTIL_ATOMIC_INIT;
  TRY(fsutil_atomic_open(path, 0644, &at));
  FILE *fp = fsutil_atomic_stream(&at);
  int ok = fp && fwrite(hdr, sizeof hdr, 1, fp) == 1;
  if (wide) ok = ok && (n == 0 || fwrite(tokens, 4, (size_t)n, fp) == (size_t)n);
  else {
    uint16_t buf[8192];
    for (int64_t i = 0; ok && i < n; i += 8192) {
      int64_t m = n - i < 8192 ? n - i : 8192;
      for (int64_t j = 0; j < m; j++) buf[j] = (uint16_t)tokens[i + j];
      ok = fwrite(buf, 2, (size_t)m, fp) == (size_t)m;
    }
  }
  ok = ok && put_bits(fp, mask, n) && put_bits(fp, starts, n);
  if (!ok) {
    fsdp_status rc = fsdp_set_error(FSDP_ERR_IO, "cannot write token file %s: %s", path, strerror(errno));
    fsutil_atomic_abort(&at);
    return rc;
  }
  return fsutil_atomic_commit(&at);
}

/* 1: PATH is a masked token file, 0: another file, −1: unreadable. */
static int is_masked(const char *path) {
  int32_t hdr[2];
  FILE *fp = fopen(path, "rb");
  if (!fp) return -1;
  int r = fread(hdr, sizeof hdr, 1, fp) == 1 &&
          ((hdr[0] == TOK_MAGIC_U16 && hdr[1] == TOK_VERSION_U16_MASKED) ||
           (hdr[0] == TOK_MAGIC_U32 && hdr[1] == TOK_VERSION_U32_MASKED));
  fclose(fp);
  return r;
}

fsdp_status tokmask_check_files(const char *key, const char *paths, int pack) {
  char *list = strdup(paths ? paths : ""), *save = NULL;
  if (!list) return fsdp_set_error(FSDP_ERR_NOMEM, "out of memory");
  fsdp_status rc = FSDP_OK;
  const char *first = NULL;   /* the first file read, and whether it is masked */
  char first_buf[4096];
  int first_masked = 0;
  for (char *p = strtok_r(list, "\n", &save); p && rc == FSDP_OK; p = strtok_r(NULL, "\n", &save)) {
    glob_t g;
    int globbed = strpbrk(p, "*?[") && glob(p, 0, NULL, &g) == 0;
    size_t n = globbed ? g.gl_pathc : 1;
    for (size_t i = 0; i < n && rc == FSDP_OK; i++) {
      const char *f = globbed ? g.gl_pathv[i] : p;
      int m = is_masked(f);
      if (m < 0) continue;   /* unreadable: the job file check and the workers say so */
      if (!first) {
        snprintf(first_buf, sizeof first_buf, "%s", f);
        first = first_buf, first_masked = m;
      }
      if (m != first_masked)
        rc = fsdp_set_error(FSDP_ERR_INVALID, "[data] %s: %s %s a loss mask and %s %s: one stream is all masked "
                            "files (gen-data --chat) or all plain ones", key, first, first_masked ? "carries" : "has no",
                            f, m ? "carries one" : "has none");
      else if (!m && !pack)
        rc = fsdp_set_error(FSDP_ERR_INVALID, "[data] pack = false: %s %s is a plain token file, one continuous stream "
                            "without documents; allowed: pack = true (the default) for it, or a masked file made by "
                            "gen-data --chat", key, f);
    }
    if (globbed) globfree(&g);
  }
  free(list);
  return rc;
}

fsdp_status tokmask_read(const char *path, uint32_t **tokens, uint8_t **mask, uint8_t **starts, int64_t *n) {
  *tokens = NULL, *mask = NULL, *starts = NULL, *n = 0;
  FILE *fp = fopen(path, "rb");
  if (!fp) return fsdp_set_error(errno == ENOENT ? FSDP_ERR_NOTFOUND : FSDP_ERR_IO, "cannot open token file %s: %s", path,
                                 strerror(errno));
  int32_t hdr[TOK_HEADER_INTS];
  fsdp_status rc = FSDP_OK;
  int width = 0;
  if (fread(hdr, sizeof hdr, 1, fp) != 1) rc = fsdp_set_error(FSDP_ERR_FORMAT, "token file %s: a short header", path);
  else if (hdr[0] == TOK_MAGIC_U16 && hdr[1] == TOK_VERSION_U16_MASKED) width = 2;
  else if (hdr[0] == TOK_MAGIC_U32 && hdr[1] == TOK_VERSION_U32_MASKED) width = 4;
  else
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "token file %s has no loss mask: magic %d version %d; expected version %d or %d",
                        path, hdr[0], hdr[1], TOK_VERSION_U16_MASKED, TOK_VERSION_U32_MASKED);
  int64_t cnt = rc == FSDP_OK ? hdr[2] : 0;
  if (rc == FSDP_OK && cnt < 0) rc = fsdp_set_error(FSDP_ERR_FORMAT, "token file %s: negative token count", path);
  size_t nb = (size_t)((cnt + 7) / 8);
  uint8_t *raw = rc == FSDP_OK ? malloc((size_t)cnt * (size_t)width + 2 * nb + 1) : NULL;
  uint32_t *t = rc == FSDP_OK ? malloc(((size_t)cnt + 1) * 4) : NULL;
  uint8_t *m = rc == FSDP_OK ? malloc((size_t)cnt + 1) : NULL, *s = rc == FSDP_OK ? malloc((size_t)cnt + 1) : NULL;
  if (rc == FSDP_OK && (!raw || !t || !m || !s)) rc = fsdp_set_error(FSDP_ERR_NOMEM, "out of memory reading %s", path);
  size_t want = (size_t)cnt * (size_t)width + 2 * nb;
  if (rc == FSDP_OK && (fread(raw, 1, want, fp) != want || fgetc(fp) != EOF))
    rc = fsdp_set_error(FSDP_ERR_FORMAT, "token file %s: its size does not match the %lld tokens of its header", path,
                        (long long)cnt);
  if (rc == FSDP_OK) {
    for (int64_t i = 0; i < cnt; i++) {
      if (width == 2) t[i] = (uint32_t)raw[2 * i] | (uint32_t)raw[2 * i + 1] << 8;
      else memcpy(&t[i], raw + 4 * i, 4);
      const uint8_t *bm = raw + (size_t)cnt * (size_t)width;
      m[i] = (bm[i / 8] >> (i % 8)) & 1;
      s[i] = (bm[nb + (size_t)(i / 8)] >> (i % 8)) & 1;
    }
    *tokens = t, *mask = m, *starts = s, *n = cnt;
    t = NULL, m = NULL, s = NULL;
  }
  free(raw), free(t), free(m), free(s);
  fclose(fp);
  return rc;
}
