/* test_comm_boot — the NCCL unique-id exchange without CUDA: a fake in-memory KV (get blocks until
 * the key is set or its timeout passes, as the coordinator's does) and fake ids, with readers that
 * start before rank 0 publishes; a missing rank 0 (timeout), a failing generator, a malformed value;
 * and the directory store of --standalone. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "comm_boot.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---- a fake KV: a few keys, blocking get ---- */

typedef struct fake_kv {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int n;
  char key[8][64];
  uint8_t val[8][256];
  size_t len[8];
  int sets;
} fake_kv;

static fsdp_status fk_set(void *ctx, const char *key, const void *val, size_t len) {
  fake_kv *k = ctx;
  if (len > sizeof k->val[0]) return fsdp_set_error(FSDP_ERR_RANGE, "fake kv: value too long");
  pthread_mutex_lock(&k->mu);
  int i = 0;
  while (i < k->n && strcmp(k->key[i], key)) i++;
  if (i == k->n) snprintf(k->key[k->n++], sizeof k->key[0], "%s", key);
  memcpy(k->val[i], val, len);
  k->len[i] = len;
  k->sets++;
  pthread_cond_broadcast(&k->cv);
  pthread_mutex_unlock(&k->mu);
  return FSDP_OK;
}

static fsdp_status fk_get(void *ctx, const char *key, void **val, size_t *len, double timeout_s) {
  fake_kv *k = ctx;
  double deadline = now_s() + timeout_s;
  pthread_mutex_lock(&k->mu);
  for (;;) {
    for (int i = 0; i < k->n; i++) {
      if (strcmp(k->key[i], key)) continue;
      *len = k->len[i];
      *val = malloc(k->len[i] ? k->len[i] : 1);
      memcpy(*val, k->val[i], k->len[i]);
      pthread_mutex_unlock(&k->mu);
      return FSDP_OK;
    }
    if (now_s() > deadline) {
      pthread_mutex_unlock(&k->mu);
      return fsdp_set_error(FSDP_ERR_TIMEOUT, "fake kv: no %s after %.3g s", key, timeout_s);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 5 * 1000 * 1000;
    if (ts.tv_nsec >= 1000000000) ts.tv_sec++, ts.tv_nsec -= 1000000000;
    pthread_cond_timedwait(&k->cv, &k->mu, &ts);
  }
}

static void fk_init(fake_kv *k) {
  memset(k, 0, sizeof *k);
  pthread_mutex_init(&k->mu, NULL);
  pthread_cond_init(&k->cv, NULL);
}

/* Fake ids: byte i = seed + i; counts its calls. */
typedef struct fake_gen {
  int calls;
  uint8_t seed;
  fsdp_status fail;
} fake_gen;

static fsdp_status gen_id(void *ctx, uint8_t id[COMM_BOOT_ID_BYTES]) {
  fake_gen *g = ctx;
  g->calls++;
  if (g->fail != FSDP_OK) return fsdp_set_error(g->fail, "fake generator refused");
  for (int i = 0; i < COMM_BOOT_ID_BYTES; i++) id[i] = (uint8_t)(g->seed + i);
  return FSDP_OK;
}

typedef struct reader {
  comm_kv kv;
  const char *key;
  int rank;
  double timeout_s;
  fake_gen gen;   /* never called on ranks > 0 */
  uint8_t id[COMM_BOOT_ID_BYTES];
  fsdp_status rc;
} reader;

static void *read_main(void *arg) {
  reader *r = arg;
  r->rc = comm_boot_exchange_id(&r->kv, r->key, r->rank, r->timeout_s, gen_id, &r->gen, r->id);
  return NULL;
}

static void test_exchange(void) {
  fake_kv k;
  fk_init(&k);
  comm_kv kv = {.ctx = &k, .set = fk_set, .get = fk_get};
  /* ranks 1..3 wait before rank 0 has published */
  reader rd[3];
  pthread_t th[3];
  for (int i = 0; i < 3; i++) {
    rd[i] = (reader){.kv = kv, .key = "job-7/a1/nccl-id", .rank = i + 1, .timeout_s = 10};
    pthread_create(&th[i], NULL, read_main, &rd[i]);
  }
  usleep(20 * 1000);   /* not synchronization: the readers are correct either way; this only makes them wait */
  fake_gen g = {.seed = 42};
  uint8_t id0[COMM_BOOT_ID_BYTES];
  CHECK_OK(comm_boot_exchange_id(&kv, "job-7/a1/nccl-id", 0, 10, gen_id, &g, id0));
  CHECK_EQ_INT(1, g.calls);
  CHECK_EQ_INT(1, k.sets);
  CHECK_EQ_INT(42, id0[0]);
  CHECK_EQ_INT((uint8_t)(42 + 127), id0[127]);
  for (int i = 0; i < 3; i++) {
    pthread_join(th[i], NULL);
    CHECK_OK(rd[i].rc);
    CHECK(memcmp(rd[i].id, id0, COMM_BOOT_ID_BYTES) == 0);
    CHECK_EQ_INT(0, rd[i].gen.calls);   /* only rank 0 makes an id */
  }

  /* rank 0 never comes: a bounded, named timeout */
  double t0 = now_s();
  uint8_t id[COMM_BOOT_ID_BYTES];
  fake_gen none = {0};
  fsdp_status rc = comm_boot_exchange_id(&kv, "job-8/nccl-id", 1, 0.2, gen_id, &none, id);
  double took = now_s() - t0;
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, rc);
  CHECK(took >= 0.15 && took < 5);
  CHECK(strstr(fsdp_last_error(), "rank 1 did not receive the communicator id") != NULL);
  CHECK(strstr(fsdp_last_error(), "job-8/nccl-id") != NULL);

  /* the generator fails on rank 0: nothing is published */
  fake_gen bad = {.fail = FSDP_ERR_CUDA};
  int sets = k.sets;
  CHECK_EQ_INT(FSDP_ERR_CUDA, comm_boot_exchange_id(&kv, "job-9/nccl-id", 0, 1, gen_id, &bad, id));
  CHECK_EQ_INT(sets, k.sets);
  CHECK(strstr(fsdp_last_error(), "fake generator refused") != NULL);

  /* a value of the wrong size (a stale or foreign key) */
  CHECK_OK(fk_set(&k, "job-10/nccl-id", "short", 5));
  CHECK_EQ_INT(FSDP_ERR_FORMAT, comm_boot_exchange_id(&kv, "job-10/nccl-id", 2, 1, gen_id, &none, id));
  CHECK(strstr(fsdp_last_error(), "has 5 bytes") != NULL);

  CHECK_EQ_INT(FSDP_ERR_INVALID, comm_boot_exchange_id(NULL, "k", 0, 1, gen_id, &g, id));
}

static void test_dir_store(void) {
  char dir[] = "/tmp/test_comm_boot.XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  comm_kv kv = comm_dir_kv(dir);
  reader rd = {.kv = kv, .key = "fsdp/nccl-id", .rank = 3, .timeout_s = 10};
  pthread_t th;
  pthread_create(&th, NULL, read_main, &rd);
  fake_gen g = {.seed = 7};
  uint8_t id0[COMM_BOOT_ID_BYTES];
  CHECK_OK(comm_boot_exchange_id(&kv, "fsdp/nccl-id", 0, 10, gen_id, &g, id0));
  pthread_join(th, NULL);
  CHECK_OK(rd.rc);
  CHECK(memcmp(rd.id, id0, COMM_BOOT_ID_BYTES) == 0);
  char path[256];
  snprintf(path, sizeof path, "%s/fsdp_nccl-id", dir);   /* '/' in a key becomes '_' */
  CHECK(access(path, R_OK) == 0);

  uint8_t id[COMM_BOOT_ID_BYTES];
  double t0 = now_s();
  CHECK_EQ_INT(FSDP_ERR_TIMEOUT, comm_boot_exchange_id(&kv, "other-id", 1, 0.1, gen_id, &g, id));
  CHECK(now_s() - t0 < 5);
  CHECK(strstr(fsdp_last_error(), "did not appear") != NULL);

  unlink(path);
  rmdir(dir);
}

int main(void) {
  test_exchange();
  test_dir_store();
  return check_done();
}
