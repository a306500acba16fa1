/* test_jobs_db — the coordinator's SQLite store: insert, state transitions with timestamps, steps,
 * listing, unknown ids, and what survives closing and reopening (a daemon restart), including
 * failing the jobs that were unfinished; ids above every job folder, damaged pages refused at open,
 * and a lost database beside kept job folders refused (statedir_jobs_db_prepare). */
#include "jobs_db.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sqlite3.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "statedir.h"


static jobs_db_row job_row(const char *name, int world) {
  jobs_db_row r = {0};
  r.name = (char *)name;
  r.world = world;
  r.device = 0;
  r.steps = 10;
  r.spec_text = "[job]\nsteps = 10\n";
  r.spec_path = "/tmp/x.ini";
  r.base_dir = "/tmp";
  r.job_dir = "/state/jobs";
  return r;
}

/* A database made before jobs had owners (the schema of that time, one queued job) is migrated when
 * opened: its job reads as owner_uid -1, owner '', umask 022; new jobs store their owner. */
static void test_owner_migration(const char *dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/old.db", dir);
  sqlite3 *old = NULL;
  CHECK(sqlite3_open(path, &old) == SQLITE_OK);
  const char *v1 =
      "CREATE TABLE jobs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, state INTEGER NOT NULL,"
      " reason TEXT NOT NULL DEFAULT '', world INTEGER NOT NULL, device INTEGER NOT NULL, steps INTEGER NOT NULL,"
      " step INTEGER NOT NULL DEFAULT 0, loss REAL NOT NULL DEFAULT 0, tokens_per_s REAL NOT NULL DEFAULT 0,"
      " spec_text TEXT NOT NULL, spec_path TEXT NOT NULL, base_dir TEXT NOT NULL, job_dir TEXT NOT NULL,"
      " submitted_at REAL NOT NULL, started_at REAL NOT NULL DEFAULT 0, finished_at REAL NOT NULL DEFAULT 0);"
      "INSERT INTO jobs (name, state, world, device, steps, spec_text, spec_path, base_dir, job_dir, submitted_at)"
      " VALUES ('legacy', 1, 2, 0, 10, '[job]', '/tmp/x.ini', '/tmp', '/state/jobs/1', 5.0);";
  CHECK(sqlite3_exec(old, v1, NULL, NULL, NULL) == SQLITE_OK);
  sqlite3_close(old);
  jobs_db *db = NULL;
  CHECK_OK(jobs_db_open(path, &db));
  if (!db) return;
  jobs_db_row g;
  CHECK_OK(jobs_db_get(db, 1, &g));
  CHECK(g.name && !strcmp(g.name, "legacy"));
  CHECK_EQ_INT(-1, g.owner_uid);
  CHECK_EQ_INT(-1, g.owner_gid);
  CHECK(g.owner && !strcmp(g.owner, ""));
  CHECK_EQ_INT(022, g.umask);
  jobs_db_row_clear(&g);
  jobs_db_row r = job_row("owned", 1);
  r.owner_uid = 1234;
  r.owner_gid = 99;
  r.owner = "alice";
  r.umask = 027;
  uint64_t id = 0;
  CHECK_OK(jobs_db_insert(db, &r, 6.0, &id));
  jobs_db_destroy(&db);
  CHECK_OK(jobs_db_open(path, &db));   /* reopening a migrated database migrates nothing again */
  CHECK_OK(jobs_db_get(db, id, &g));
  CHECK_EQ_INT(1234, g.owner_uid);
  CHECK_EQ_INT(99, g.owner_gid);
  CHECK(g.owner && !strcmp(g.owner, "alice"));
  CHECK_EQ_INT(027, g.umask);
  jobs_db_row_clear(&g);
  jobs_db_destroy(&db);
}

/* Two jobs inserted; the first fetched back field by field. Returns their ids in ID1, ID2. */
static void insert_and_get(jobs_db *db, const jobs_db_row *r1, uint64_t *id1, uint64_t *id2) {
  jobs_db_row r2 = job_row("second", 4);
  CHECK_OK(jobs_db_insert(db, r1, 1000.0, id1));
  CHECK_OK(jobs_db_insert(db, &r2, 1001.0, id2));
  CHECK_EQ_INT(1, *id1);
  CHECK_EQ_INT(2, *id2);
  jobs_db_row g;
  CHECK_OK(jobs_db_get(db, *id1, &g));
  CHECK(strcmp(g.name, "first") == 0);
  CHECK_EQ_INT(1, g.state);
  CHECK_EQ_INT(2, g.world);
  CHECK_EQ_INT(10, g.steps);
  CHECK(strcmp(g.job_dir, "/state/jobs/1") == 0);
  CHECK(strcmp(g.spec_text, "[job]\nsteps = 10\n") == 0);
  CHECK_NEAR(1000.0, g.submitted_at, 0, 0);
  CHECK_NEAR(0.0, g.started_at, 0, 0);
  jobs_db_row_clear(&g);
}

/* Job ID runs three steps and succeeds: its transitions with their timestamps, its step rows,
 * and the row's last-step figures. */
static void transitions_and_steps(jobs_db *db, uint64_t id) {
  CHECK_OK(jobs_db_set_state(db, id, 2, NULL, 1002.0));
  CHECK_OK(jobs_db_set_state(db, id, 3, NULL, 1003.0));
  for (int s = 1; s <= 3; s++) {
    jobs_db_step st = {.step = s, .loss = 5.0 - s, .lr = 1e-3 * s, .grad_norm = 0.5, .tokens = 1024,
                       .step_ms = 100.0 + s, .tokens_per_s = 1024 / ((100.0 + s) / 1000)};
    char json[64];
    snprintf(json, sizeof json, "{\"step\":%d}", s);
    CHECK_OK(jobs_db_add_step(db, id, &st, json));
  }
  CHECK_OK(jobs_db_set_state(db, id, 4, NULL, 1010.0));
  int states[8];
  double at[8];
  size_t n = 0;
  CHECK_OK(jobs_db_transitions(db, id, states, at, 8, &n));
  CHECK_EQ_INT(4, n);
  int want[] = {1, 2, 3, 4};
  double want_at[] = {1000.0, 1002.0, 1003.0, 1010.0};
  for (size_t i = 0; i < n && i < 4; i++) {
    CHECK_EQ_INT(want[i], states[i]);
    CHECK_NEAR(want_at[i], at[i], 0, 0);
  }
  int count = 0;
  CHECK_OK(jobs_db_step_count(db, id, &count));
  CHECK_EQ_INT(3, count);
  char *json = NULL;
  CHECK_OK(jobs_db_step_json(db, id, 2, &json));
  CHECK(json && strcmp(json, "{\"step\":2}") == 0);
  free(json);
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, jobs_db_step_json(db, id, 7, &json));

  jobs_db_row g;
  CHECK_OK(jobs_db_get(db, id, &g));
  CHECK_EQ_INT(4, g.state);
  CHECK_EQ_INT(3, g.step);
  CHECK_NEAR(2.0, g.loss, 0, 0);
  CHECK_NEAR(3e-3, g.last_lr, 0, 1e-12);
  CHECK_NEAR(103.0, g.last_step_ms, 0, 0);
  CHECK_EQ_INT(1024, g.last_tokens);
  CHECK_NEAR(1003.0, g.started_at, 0, 0);
  CHECK_NEAR(1010.0, g.finished_at, 0, 0);
  jobs_db_row_clear(&g);
}

/* Unknown ids are refused by name; the listing is newest first, limited. */
static void unknown_and_list(jobs_db *db, uint64_t id1, uint64_t id2) {
  jobs_db_row g;
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, jobs_db_get(db, 99, &g));
  CHECK(strstr(fsdp_last_error(), "no job 99") != NULL);
  CHECK_EQ_INT(FSDP_ERR_NOTFOUND, jobs_db_set_state(db, 99, 5, "x", 1.0));
  jobs_db_row *rows = NULL;
  size_t n = 0;
  CHECK_OK(jobs_db_list(db, 1, &rows, &n));
  CHECK_EQ_INT(1, n);
  if (n == 1) CHECK_EQ_INT(id2, rows[0].id);
  jobs_db_rows_destroy(&rows, n);
  CHECK_OK(jobs_db_list(db, 0, &rows, &n));
  CHECK_EQ_INT(2, n);
  if (n == 2) {
    CHECK_EQ_INT(id2, rows[0].id);
    CHECK_EQ_INT(id1, rows[1].id);
  }
  jobs_db_rows_destroy(&rows, n);
}

/* After a restart (the database at PATH reopened): everything is still there; the running job ID2
 * is failed, the finished one ID1 untouched, the queued one ID3 still queued; ids are never reused. */
static void after_restart(const char *path, const jobs_db_row *r1, uint64_t id1, uint64_t id2, uint64_t id3) {
  jobs_db *db = NULL;
  jobs_db_row g;
  CHECK_OK(jobs_db_open(path, &db));
  if (!db) return;
  int nfail = 0;
  CHECK_OK(jobs_db_fail_started(db, "daemon restarted", 2000.0, &nfail));
  CHECK_EQ_INT(1, nfail);
  CHECK_OK(jobs_db_get(db, id2, &g));
  CHECK_EQ_INT(5, g.state);
  CHECK(strcmp(g.reason, "daemon restarted") == 0);
  CHECK_NEAR(2000.0, g.finished_at, 0, 0);
  jobs_db_row_clear(&g);
  CHECK_OK(jobs_db_get(db, id1, &g));
  CHECK_EQ_INT(4, g.state);
  CHECK_EQ_INT(3, g.step);
  jobs_db_row_clear(&g);
  CHECK_OK(jobs_db_get(db, id3, &g));
  CHECK_EQ_INT(1, g.state);
  jobs_db_row_clear(&g);
  CHECK_OK(jobs_db_fail_started(db, "daemon restarted", 2001.0, &nfail));
  CHECK_EQ_INT(0, nfail);
  int states[8];
  double at[8];
  size_t n = 0;
  CHECK_OK(jobs_db_transitions(db, id2, states, at, 8, &n));
  CHECK_EQ_INT(4, n);   /* queued, starting, running, failed */
  if (n == 4) CHECK_EQ_INT(5, states[3]);
  uint64_t id4 = 0;
  CHECK_OK(jobs_db_insert(db, r1, 3000.0, &id4));
  CHECK_EQ_INT(4, id4);   /* ids are never reused */
  jobs_db_destroy(&db);
  jobs_db_destroy(&db);     /* NULL-safe */
}

/* Running (and starting) jobs first, then the newest; the counts are every job's, whatever the limit. */
static void test_running_first(const char *dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/order.db", dir);
  jobs_db *db = NULL;
  CHECK_OK(jobs_db_open(path, &db));
  if (!db) return;
  jobs_db_row r = job_row("q", 1);
  uint64_t id[10];
  for (int i = 0; i < 10; i++) CHECK_OK(jobs_db_insert(db, &r, 1.0 + i, &id[i]));
  CHECK_OK(jobs_db_set_state(db, id[1], 2, NULL, 20.0));   /* starting */
  CHECK_OK(jobs_db_set_state(db, id[2], 2, NULL, 21.0));
  CHECK_OK(jobs_db_set_state(db, id[2], 3, NULL, 22.0));   /* running */
  CHECK_OK(jobs_db_set_state(db, id[0], 5, "x", 23.0));    /* failed */
  jobs_db_row *rows = NULL;
  size_t n = 0;
  CHECK_OK(jobs_db_list_running_first(db, 3, &rows, &n));
  CHECK_EQ_INT(3, n);
  if (n == 3) {
    CHECK_EQ_INT(id[2], rows[0].id);
    CHECK_EQ_INT(id[1], rows[1].id);
    CHECK_EQ_INT(id[9], rows[2].id);
  }
  jobs_db_rows_destroy(&rows, n);
  CHECK_OK(jobs_db_list_running_first(db, 0, &rows, &n));   /* 0: all */
  CHECK_EQ_INT(10, n);
  jobs_db_rows_destroy(&rows, n);
  uint32_t k[JOBS_DB_NSTATES];
  CHECK_OK(jobs_db_state_counts(db, k));
  CHECK(k[1] == 7 && k[2] == 1 && k[3] == 1 && k[4] == 0 && k[5] == 1 && k[6] == 0);
  jobs_db_destroy(&db);
}

/* Ids are above every job folder and every id given before, whatever LAST says. */
static void test_ids_above(const char *dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/ids.db", dir);
  jobs_db *db = NULL;
  CHECK_OK(jobs_db_open(path, &db));
  if (!db) return;
  jobs_db_row r = job_row("ids", 1);
  uint64_t id = 0;
  CHECK_OK(jobs_db_ids_above(db, 41));   /* a fresh database beside jobs/41 */
  CHECK_OK(jobs_db_insert(db, &r, 1.0, &id));
  CHECK_EQ_INT(42, id);
  CHECK_OK(jobs_db_ids_above(db, 7));    /* never lower */
  CHECK_OK(jobs_db_insert(db, &r, 2.0, &id));
  CHECK_EQ_INT(43, id);
  jobs_db_destroy(&db);
  CHECK_OK(jobs_db_open(path, &db));
  if (!db) return;
  CHECK_OK(jobs_db_ids_above(db, 99));   /* a folder whose row a lost transaction took */
  CHECK_OK(jobs_db_insert(db, &r, 3.0, &id));
  CHECK_EQ_INT(100, id);
  jobs_db_destroy(&db);
}

/* Damaged pages (the rows of 300 queued jobs, a page overwritten) and a file that is no database:
 * refused at open with one line naming the file and the remedy, never opened half-readable. */
static void test_corrupt(const char *dir) {
  char path[300];
  snprintf(path, sizeof path, "%s/corrupt.db", dir);
  jobs_db *db = NULL;
  CHECK_OK(jobs_db_open(path, &db));
  if (!db) return;
  static char spec[2000];
  memset(spec, 'x', sizeof spec - 1);
  jobs_db_row r = job_row("queued", 1);
  r.spec_text = spec;
  for (int i = 0; i < 300; i++) {
    uint64_t id;
    CHECK_OK(jobs_db_insert(db, &r, 1.0 + i, &id));
  }
  jobs_db_destroy(&db);   /* the last connection: the write-ahead log is folded into the file */
  int fd = open(path, O_RDWR);
  CHECK(fd >= 0);
  struct stat st;
  CHECK(fstat(fd, &st) == 0 && st.st_size > 40 * 4096);
  char junk[4096];
  for (size_t i = 0; i < sizeof junk; i++) junk[i] = (char)(i * 131 + 7);
  CHECK(pwrite(fd, junk, sizeof junk, 20 * 4096) == (ssize_t)sizeof junk);   /* one page of the rows */
  close(fd);
  CHECK(jobs_db_open(path, &db) == FSDP_ERR_STATE);
  CHECK(db == NULL);
  CHECK(strstr(fsdp_last_error(), path) != NULL);
  CHECK(strstr(fsdp_last_error(), "restore it from a backup") != NULL);
  CHECK(strchr(fsdp_last_error(), '\n') == NULL);
  snprintf(path, sizeof path, "%s/notadb.db", dir);
  FILE *f = fopen(path, "w");
  for (int i = 0; i < 2000; i++) fputs("not a database ", f);
  fclose(f);
  CHECK(jobs_db_open(path, &db) == FSDP_ERR_STATE);
  CHECK(strstr(fsdp_last_error(), "is damaged") != NULL);
}

/* The database lost (removed, or emptied) while jobs/ keeps its folders: refused, naming the file,
 * the newest folder and the remedy; with no folders a missing database is created 0600. */
static void test_lost(const char *dir) {
  char state[300], jobs[320], dbp[320];
  snprintf(state, sizeof state, "%s/state", dir);
  snprintf(jobs, sizeof jobs, "%s/jobs", state);
  snprintf(dbp, sizeof dbp, "%s/jobs.db", state);
  CHECK(mkdir(state, 0700) == 0 && mkdir(jobs, 0700) == 0);
  int jfd = open(jobs, O_RDONLY | O_DIRECTORY);
  CHECK(jfd >= 0);
  uint64_t last = 99;
  CHECK_OK(statedir_jobs_db_prepare(dbp, jfd, jobs, &last));   /* first start */
  CHECK_EQ_INT(0, last);
  struct stat st;
  CHECK(stat(dbp, &st) == 0 && (st.st_mode & 0777) == 0600 && st.st_size == 0);
  CHECK(mkdirat(jfd, "3", 0755) == 0 && mkdirat(jfd, "12", 0755) == 0 && mkdirat(jfd, "x", 0755) == 0 &&
        mkdirat(jfd, "012", 0755) == 0);
  CHECK(statedir_jobs_db_prepare(dbp, jfd, jobs, &last) == FSDP_ERR_STATE);   /* empty, beside folders */
  CHECK(strstr(fsdp_last_error(), "is empty") && strstr(fsdp_last_error(), "2 job folders (the newest 12)") &&
        strstr(fsdp_last_error(), "restore the database from a backup"));
  CHECK(unlink(dbp) == 0);
  CHECK(statedir_jobs_db_prepare(dbp, jfd, jobs, &last) == FSDP_ERR_STATE);   /* removed */
  CHECK(strstr(fsdp_last_error(), dbp) && strstr(fsdp_last_error(), "is missing"));
  CHECK(access(dbp, F_OK) != 0);   /* nothing created in its place */
  jobs_db *db = NULL;   /* a database with its history: the next id is above the newest folder */
  CHECK(close(open(dbp, O_CREAT | O_WRONLY, 0600)) == 0);
  CHECK_OK(jobs_db_open(dbp, &db));
  jobs_db_row r = job_row("kept", 1);
  uint64_t id = 0;
  CHECK_OK(jobs_db_insert(db, &r, 1.0, &id));
  jobs_db_destroy(&db);
  CHECK_OK(statedir_jobs_db_prepare(dbp, jfd, jobs, &last));
  CHECK_EQ_INT(12, last);
  close(jfd);
}

int main(void) {
  char dir[] = "/tmp/test-jobs-db-XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  char path[256];
  snprintf(path, sizeof path, "%s/jobs.db", dir);

  jobs_db *db = NULL;
  CHECK_OK(jobs_db_open(path, &db));
  if (!db) return check_done();
  uint64_t id1 = 0, id2 = 0;
  jobs_db_row r1 = job_row("first", 2);
  insert_and_get(db, &r1, &id1, &id2);
  transitions_and_steps(db, id1);
  unknown_and_list(db, id1, id2);

  /* job 2 is running when the daemon dies; job 3 is still queued */
  CHECK_OK(jobs_db_set_state(db, id2, 2, NULL, 1500.0));
  CHECK_OK(jobs_db_set_state(db, id2, 3, NULL, 1501.0));
  uint64_t id3 = 0;
  CHECK_OK(jobs_db_insert(db, &r1, 1502.0, &id3));
  CHECK_EQ_INT(3, id3);
  /* WAL mode: the write-ahead log exists while the database is open */
  char wal[300];
  snprintf(wal, sizeof wal, "%s-wal", path);
  CHECK(access(wal, F_OK) == 0);
  jobs_db_destroy(&db);
  CHECK(db == NULL);
  after_restart(path, &r1, id1, id2, id3);

  test_owner_migration(dir);
  test_ids_above(dir);
  test_running_first(dir);
  test_corrupt(dir);
  test_lost(dir);

  char cmd[300];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
  return check_done();
}
