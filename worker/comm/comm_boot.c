/* comm_boot — the unique-id exchange and the directory store; see comm_boot.h. */
#include "comm_boot.h"
#include "monotime.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

fsdp_status comm_boot_exchange_id(const comm_kv *kv, const char *key, int rank, double timeout_s,
                                  comm_boot_idgen gen, void *gen_ctx, uint8_t id[COMM_BOOT_ID_BYTES]) {
  if (!kv || !kv->set || !kv->get || !key || !gen || !id)
    return fsdp_set_error(FSDP_ERR_INVALID, "comm_boot_exchange_id: NULL store, key, generator or id");
  char why[512];   /* the callee's message, copied: fsdp_set_error rewrites the buffer it lives in */
  if (rank == 0) {
    fsdp_status rc = gen(gen_ctx, id);
    if (rc != FSDP_OK) {
      snprintf(why, sizeof why, "%s", fsdp_last_error());
      return fsdp_set_error(rc, "rank 0 could not make the communicator id: %s", why);
    }
    rc = kv->set(kv->ctx, key, id, COMM_BOOT_ID_BYTES);
    if (rc != FSDP_OK) {
      snprintf(why, sizeof why, "%s", fsdp_last_error());
      return fsdp_set_error(rc, "rank 0 could not publish the communicator id under %s: %s", key, why);
    }
    return FSDP_OK;
  }
  void *val = NULL;
  size_t len = 0;
  fsdp_status rc = kv->get(kv->ctx, key, &val, &len, timeout_s);
  if (rc != FSDP_OK) {
    free(val);
    snprintf(why, sizeof why, "%s", fsdp_last_error());
    return fsdp_set_error(rc, "rank %d did not receive the communicator id from rank 0 (key %s, timeout_s %.3g): %s",
                          rank, key, timeout_s, why);
  }
  if (len != COMM_BOOT_ID_BYTES) {
    free(val);
    return fsdp_set_error(FSDP_ERR_FORMAT, "rank %d: the communicator id under %s has %zu bytes; expected %d (a stale "
                          "or foreign key: use a fresh rendezvous)", rank, key, len, COMM_BOOT_ID_BYTES);
  }
  memcpy(id, val, COMM_BOOT_ID_BYTES);
  free(val);
  return FSDP_OK;
}

/* ---- the directory store ---- */

static fsdp_status key_path(const char *dir, const char *key, char *out, size_t cap, const char *suffix) {
  int n = snprintf(out, cap, "%s/%s%s", dir, key, suffix);
  if (n < 0 || (size_t)n >= cap) return fsdp_set_error(FSDP_ERR_RANGE, "rendezvous path %s/%s is too long", dir, key);
  for (char *p = out + strlen(dir) + 1; *p; p++)
    if (*p == '/') *p = '_';
  return FSDP_OK;
}

static fsdp_status dir_set(void *ctx, const char *key, const void *val, size_t len) {
  const char *dir = ctx;
  char path[4096], tmp[4200];
  TRY(key_path(dir, key, path, sizeof path, ""));
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
  /* never through a link someone planted at the temporary's name */
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  FILE *f = fd >= 0 ? fdopen(fd, "wb") : NULL;
  if (!f && fd >= 0) close(fd);
  if (!f) return fsdp_set_error(FSDP_ERR_IO, "rendezvous: cannot create %s: %s", tmp, strerror(errno));
  int ok = fwrite(val, 1, len, f) == len;
  ok = (fclose(f) == 0) && ok;
  if (!ok || rename(tmp, path) != 0) {
    int e = errno;
    unlink(tmp);
    return fsdp_set_error(FSDP_ERR_IO, "rendezvous: cannot write %s: %s", path, strerror(e));
  }
  return FSDP_OK;
}

static fsdp_status dir_get(void *ctx, const char *key, void **val, size_t *len, double timeout_s) {
  const char *dir = ctx;
  char path[4096];
  TRY(key_path(dir, key, path, sizeof path, ""));
  *val = NULL;
  *len = 0;
  double deadline = monotime_s() + timeout_s;
  FILE *f;
  while (!(f = fopen(path, "rb"))) {
    if (errno != ENOENT) return fsdp_set_error(FSDP_ERR_IO, "rendezvous: cannot open %s: %s", path, strerror(errno));
    if (monotime_s() > deadline)
      return fsdp_set_error(FSDP_ERR_TIMEOUT, "rendezvous: %s did not appear within %.3g s (did rank 0 start?)", path,
                            timeout_s);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  struct stat st;
  fsdp_status rc = FSDP_OK;
  if (fstat(fileno(f), &st) != 0) {
    rc = fsdp_set_error(FSDP_ERR_IO, "rendezvous: cannot stat %s: %s", path, strerror(errno));
  } else if (!(*val = malloc(st.st_size ? (size_t)st.st_size : 1))) {
    rc = fsdp_set_error(FSDP_ERR_NOMEM, "rendezvous: cannot allocate %lld bytes", (long long)st.st_size);
  } else if (fread(*val, 1, (size_t)st.st_size, f) != (size_t)st.st_size) {
    rc = fsdp_set_error(FSDP_ERR_IO, "rendezvous: short read of %s", path);
    free(*val);
    *val = NULL;
  } else {
    *len = (size_t)st.st_size;
  }
  fclose(f);
  return rc;
}

comm_kv comm_dir_kv(const char *dir) { return (comm_kv){.ctx = (void *)(uintptr_t)dir, .set = dir_set, .get = dir_get}; }
