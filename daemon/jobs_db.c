/* jobs_db — see jobs_db.h. */
#include "jobs_db.h"

#include <sqlite3.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The owner's columns; a database from before jobs had owners gets them by migrate_owner. */
#define OWNER_COLS                                                                                  \
  "owner_uid INTEGER NOT NULL DEFAULT -1, owner_gid INTEGER NOT NULL DEFAULT -1,"                    \
  " owner TEXT NOT NULL DEFAULT '', umask INTEGER NOT NULL DEFAULT 18"

static const char *const schema =
    "PRAGMA journal_mode=WAL;"
    "PRAGMA synchronous=NORMAL;"
    "PRAGMA foreign_keys=ON;"
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT,"
    "  name TEXT NOT NULL, state INTEGER NOT NULL, reason TEXT NOT NULL DEFAULT '',"
    "  world INTEGER NOT NULL, device INTEGER NOT NULL, steps INTEGER NOT NULL,"
    "  step INTEGER NOT NULL DEFAULT 0, loss REAL NOT NULL DEFAULT 0, tokens_per_s REAL NOT NULL DEFAULT 0,"
    "  spec_text TEXT NOT NULL, spec_path TEXT NOT NULL, base_dir TEXT NOT NULL, job_dir TEXT NOT NULL,"
    "  submitted_at REAL NOT NULL, started_at REAL NOT NULL DEFAULT 0, finished_at REAL NOT NULL DEFAULT 0,"
    "  " OWNER_COLS ");"
    "CREATE TABLE IF NOT EXISTS job_transitions ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), state INTEGER NOT NULL,"
    "  reason TEXT NOT NULL DEFAULT '', at REAL NOT NULL);"
    "CREATE INDEX IF NOT EXISTS job_transitions_job ON job_transitions(job_id);"
    "CREATE TABLE IF NOT EXISTS job_steps ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), step INTEGER NOT NULL,"
    "  loss REAL, lr REAL, grad_norm REAL, tokens INTEGER, step_ms REAL, tokens_per_s REAL,"
    "  json TEXT NOT NULL, PRIMARY KEY (job_id, step));"
    /* the latest validation loss (status) without reading every step's line: only the eval steps */
    "CREATE INDEX IF NOT EXISTS job_steps_val ON job_steps(job_id, step)"
    "  WHERE json_extract(json, '$.val_loss') IS NOT NULL;";

enum {
  ST_INSERT, ST_TRANSITION, ST_SET_STATE, ST_SET_STARTED, ST_SET_FINISHED, ST_ADD_STEP, ST_PROGRESS,
  ST_GET, ST_LIST, ST_LIST_ALL, ST_STARTED, ST_TRANSITIONS, ST_STEP_COUNT, ST_BEGIN, ST_COMMIT,
  ST_ROLLBACK, ST_SET_DIR, ST_STEP_JSON, ST_LAST_VAL, ST_LIST_RUN_FIRST, ST_STATE_COUNTS, ST_COUNT
};

#define ROW_COLS                                                                                  \
  "j.id, j.name, j.state, j.reason, j.world, j.device, j.steps, j.step, j.loss, j.tokens_per_s, " \
  "j.spec_text, j.spec_path, j.base_dir, j.job_dir, j.submitted_at, j.started_at, j.finished_at, "  \
  "s.lr, s.grad_norm, s.step_ms, s.tokens, j.owner_uid, j.owner_gid, j.owner, j.umask "                                                      \
  "FROM jobs j LEFT JOIN job_steps s ON s.job_id = j.id AND s.step = j.step "

static const char *const sql[ST_COUNT] = {
  [ST_INSERT] = "INSERT INTO jobs (name, state, reason, world, device, steps, spec_text, spec_path, base_dir,"
                " job_dir, submitted_at, owner_uid, owner_gid, owner, umask)"
                " VALUES (?1, 1, '', ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
  [ST_TRANSITION] = "INSERT INTO job_transitions (job_id, state, reason, at) VALUES (?1, ?2, ?3, ?4)",
  [ST_SET_STATE] = "UPDATE jobs SET state = ?2, reason = ?3 WHERE id = ?1",
  [ST_SET_STARTED] = "UPDATE jobs SET started_at = ?2 WHERE id = ?1",
  [ST_SET_FINISHED] = "UPDATE jobs SET finished_at = ?2 WHERE id = ?1",
  [ST_ADD_STEP] = "INSERT OR REPLACE INTO job_steps (job_id, step, loss, lr, grad_norm, tokens, step_ms,"
                  " tokens_per_s, json) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
  [ST_PROGRESS] = "UPDATE jobs SET step = ?2, loss = ?3, tokens_per_s = ?4 WHERE id = ?1",
  [ST_GET] = "SELECT " ROW_COLS "WHERE j.id = ?1",
  [ST_LIST] = "SELECT " ROW_COLS "ORDER BY j.id DESC LIMIT ?1",
  [ST_LIST_ALL] = "SELECT " ROW_COLS "ORDER BY j.id DESC",
  [ST_LIST_RUN_FIRST] = "SELECT " ROW_COLS "ORDER BY j.state IN (2, 3) DESC, j.id DESC LIMIT ?1",
  [ST_STATE_COUNTS] = "SELECT state, count(*) FROM jobs GROUP BY state",
  [ST_STARTED] = "SELECT id FROM jobs WHERE state IN (2, 3)",
  [ST_TRANSITIONS] = "SELECT state, at FROM job_transitions WHERE job_id = ?1 ORDER BY rowid",
  [ST_STEP_COUNT] = "SELECT count(*) FROM job_steps WHERE job_id = ?1",
  [ST_BEGIN] = "BEGIN",
  [ST_COMMIT] = "COMMIT",
  [ST_ROLLBACK] = "ROLLBACK",
  [ST_STEP_JSON] = "SELECT json FROM job_steps WHERE job_id = ?1 AND step = ?2",
  [ST_SET_DIR] = "UPDATE jobs SET job_dir = ?2 WHERE id = ?1",
  [ST_LAST_VAL] = "SELECT step, json_extract(json, '$.val_loss') FROM job_steps WHERE job_id = ?1"
                  " AND json_extract(json, '$.val_loss') IS NOT NULL ORDER BY step DESC LIMIT 1",
};

struct jobs_db {
  sqlite3 *db;
  sqlite3_stmt *st[ST_COUNT];
  char path[1024];
};

static fsdp_status db_fail(jobs_db *db, const char *what) {
  return fsdp_set_error(FSDP_ERR_IO, "job database %s: %s: %s", db->path, what, sqlite3_errmsg(db->db));
}

/* Reset the statement for its next use; every function ends its use with this. */
static sqlite3_stmt *stmt(jobs_db *db, int i) {
  sqlite3_reset(db->st[i]);
  sqlite3_clear_bindings(db->st[i]);
  return db->st[i];
}

static fsdp_status run_done(jobs_db *db, int i, const char *what) {
  int rc = sqlite3_step(db->st[i]);
  fsdp_status s = (rc == SQLITE_DONE || rc == SQLITE_ROW) ? FSDP_OK : db_fail(db, what);
  sqlite3_reset(db->st[i]);
  return s;
}

/* A database made before jobs had owners: add the owner's columns (its jobs read as owner_uid -1,
 * the daemon's own user, which is whose rights they ran with). */
static fsdp_status migrate_owner(jobs_db *db) {
  sqlite3_stmt *probe = NULL;
  int has = sqlite3_prepare_v2(db->db, "SELECT owner_uid FROM jobs LIMIT 0", -1, &probe, NULL) == SQLITE_OK;
  sqlite3_finalize(probe);
  if (has) return FSDP_OK;
  static const char *const alter =
      "BEGIN;"
      "ALTER TABLE jobs ADD COLUMN owner_uid INTEGER NOT NULL DEFAULT -1;"
      "ALTER TABLE jobs ADD COLUMN owner_gid INTEGER NOT NULL DEFAULT -1;"
      "ALTER TABLE jobs ADD COLUMN owner TEXT NOT NULL DEFAULT '';"
      "ALTER TABLE jobs ADD COLUMN umask INTEGER NOT NULL DEFAULT 18;"
      "COMMIT;";
  char *err = NULL;
  if (sqlite3_exec(db->db, alter, NULL, NULL, &err) != SQLITE_OK) {
    fsdp_status rc = fsdp_set_error(FSDP_ERR_IO, "job database %s: cannot add the owner columns: %s", db->path, err ? err : "?");
    sqlite3_free(err);
    sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
    return rc;
  }
  return FSDP_OK;
}

/* The remedy, the same in every refusal to use a damaged or lost database (one line). */
#define DB_REMEDY "restore it from a backup, or move it and the jobs folder beside it aside to start with an empty history"

static fsdp_status db_corrupt(jobs_db *db, const char *what) {
  return fsdp_set_error(FSDP_ERR_STATE, "job database %s is damaged (%s); fsdpd does not start on it, since the jobs "
                        "it lost would never run and their ids would be given again: " DB_REMEDY, db->path, what);
}

static int is_corrupt(int code) { return (code & 0xff) == SQLITE_CORRUPT || (code & 0xff) == SQLITE_NOTADB; }

/* SQLite's quick_check (every page's structure, without the index cross-checks of integrity_check):
 * a database whose pages are damaged is refused before it is used, rather than serving with rows
 * that no query can read. */
static fsdp_status check_pages(jobs_db *db) {
  sqlite3_stmt *q = NULL;
  int rc = sqlite3_prepare_v2(db->db, "PRAGMA quick_check(1)", -1, &q, NULL);
  if (rc == SQLITE_OK) rc = sqlite3_step(q);
  fsdp_status st = FSDP_OK;
  if (rc == SQLITE_ROW) {
    const char *r = (const char *)sqlite3_column_text(q, 0);
    if (!r || strcmp(r, "ok")) {
      char first[160];   /* the first problem, on one line */
      snprintf(first, sizeof first, "quick_check: %s", r ? r : "no result");
      for (char *c = first; *c; c++)
        if (*c == '\n' || *c == '\r' || *c == '\t') *c = ' ';
      st = db_corrupt(db, first);
    }
  } else if (is_corrupt(rc)) {
    st = db_corrupt(db, sqlite3_errmsg(db->db));
  } else {
    st = db_fail(db, "quick_check");
  }
  sqlite3_finalize(q);
  return st;
}

fsdp_status jobs_db_open(const char *path, jobs_db **out) {
  *out = NULL;
  jobs_db *db = calloc(1, sizeof *db);
  if (!db) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the job database handle");
  snprintf(db->path, sizeof db->path, "%s", path);
  fsdp_status rc = FSDP_OK;
  if (sqlite3_open_v2(path, &db->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
    rc = db_fail(db, "open");
    goto fail;
  }
  sqlite3_busy_timeout(db->db, 5000);
  TRY_GOTO(check_pages(db), rc, fail);
  char *err = NULL;
  int erc = sqlite3_exec(db->db, schema, NULL, NULL, &err);
  if (erc != SQLITE_OK) {
    if (is_corrupt(erc)) rc = db_corrupt(db, err ? err : "?");
    else rc = fsdp_set_error(FSDP_ERR_IO, "job database %s: cannot create the schema: %s", path, err ? err : "?");
    sqlite3_free(err);
    goto fail;
  }
  TRY_GOTO(migrate_owner(db), rc, fail);
  for (int i = 0; i < ST_COUNT; i++)
    if (sqlite3_prepare_v2(db->db, sql[i], -1, &db->st[i], NULL) != SQLITE_OK) {
      rc = db_fail(db, sql[i]);
      goto fail;
    }
  *out = db;
  return FSDP_OK;
fail:
  jobs_db_destroy(&db);
  return rc;
}

fsdp_status jobs_db_ids_above(jobs_db *db, uint64_t last) {
  if (last > (uint64_t)INT64_MAX) return fsdp_set_error(FSDP_ERR_RANGE, "job id %llu is out of range", (unsigned long long)last);
  /* AUTOINCREMENT draws the next id from sqlite_sequence (made with the table's first row) */
  static const char *const q =
      "INSERT INTO sqlite_sequence (name, seq) SELECT 'jobs', 0 WHERE NOT EXISTS"
      " (SELECT 1 FROM sqlite_sequence WHERE name = 'jobs');"
      "UPDATE sqlite_sequence SET seq = max(seq, ?1, (SELECT coalesce(max(id), 0) FROM jobs)) WHERE name = 'jobs';";
  sqlite3_stmt *st = NULL;
  const char *tail = q;
  fsdp_status rc = FSDP_OK;
  while (rc == FSDP_OK && tail && *tail) {
    if (sqlite3_prepare_v2(db->db, tail, -1, &st, &tail) != SQLITE_OK) return db_fail(db, "reserving job ids");
    if (!st) break;
    if (sqlite3_bind_parameter_count(st) >= 1) sqlite3_bind_int64(st, 1, (sqlite3_int64)last);
    if (sqlite3_step(st) != SQLITE_DONE) rc = db_fail(db, "reserving job ids");
    sqlite3_finalize(st);
    st = NULL;
  }
  return rc;
}

void jobs_db_destroy(jobs_db **p) {
  if (!p || !*p) return;
  jobs_db *db = *p;
  for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(db->st[i]);
  if (db->db) sqlite3_close(db->db);
  free(db);
  *p = NULL;
}

static const char *nz(const char *s) { return s ? s : ""; }

static fsdp_status add_transition(jobs_db *db, uint64_t id, int state, const char *reason, double now) {
  sqlite3_stmt *s = stmt(db, ST_TRANSITION);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  sqlite3_bind_int(s, 2, state);
  sqlite3_bind_text(s, 3, nz(reason), -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(s, 4, now);
  return run_done(db, ST_TRANSITION, "recording a state transition");
}

static fsdp_status begin(jobs_db *db) { stmt(db, ST_BEGIN); return run_done(db, ST_BEGIN, "BEGIN"); }
static fsdp_status commit(jobs_db *db) { stmt(db, ST_COMMIT); return run_done(db, ST_COMMIT, "COMMIT"); }
static void rollback(jobs_db *db) { stmt(db, ST_ROLLBACK); (void)run_done(db, ST_ROLLBACK, "ROLLBACK"); }

fsdp_status jobs_db_insert(jobs_db *db, const jobs_db_row *r, double now, uint64_t *id) {
  fsdp_status rc;
  TRY(begin(db));
  sqlite3_stmt *s = stmt(db, ST_INSERT);
  sqlite3_bind_text(s, 1, nz(r->name), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 2, r->world);
  sqlite3_bind_int(s, 3, r->device);
  sqlite3_bind_int(s, 4, r->steps);
  sqlite3_bind_text(s, 5, nz(r->spec_text), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 6, nz(r->spec_path), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 7, nz(r->base_dir), -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 8, nz(r->job_dir), -1, SQLITE_TRANSIENT);
  sqlite3_bind_double(s, 9, now);
  sqlite3_bind_int64(s, 10, r->owner_uid);
  sqlite3_bind_int64(s, 11, r->owner_gid);
  sqlite3_bind_text(s, 12, nz(r->owner), -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 13, r->umask);
  TRY_GOTO(run_done(db, ST_INSERT, "inserting a job"), rc, fail);
  *id = (uint64_t)sqlite3_last_insert_rowid(db->db);
  if (r->job_dir && *r->job_dir) {   /* the job's directory is PARENT/ID */
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/%llu", r->job_dir, (unsigned long long)*id);
    sqlite3_stmt *u = stmt(db, ST_SET_DIR);
    sqlite3_bind_int64(u, 1, (sqlite3_int64)*id);
    sqlite3_bind_text(u, 2, dir, -1, SQLITE_TRANSIENT);
    TRY_GOTO(run_done(db, ST_SET_DIR, "setting a job's directory"), rc, fail);
  }
  TRY_GOTO(add_transition(db, *id, 1, NULL, now), rc, fail);
  return commit(db);
fail:
  rollback(db);
  return rc;
}

fsdp_status jobs_db_set_state(jobs_db *db, uint64_t id, int state, const char *reason, double now) {
  fsdp_status rc;
  TRY(begin(db));
  sqlite3_stmt *s = stmt(db, ST_SET_STATE);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  sqlite3_bind_int(s, 2, state);
  sqlite3_bind_text(s, 3, nz(reason), -1, SQLITE_TRANSIENT);
  TRY_GOTO(run_done(db, ST_SET_STATE, "updating a job's state"), rc, fail);
  if (sqlite3_changes(db->db) == 0) {
    rc = fsdp_set_error(FSDP_ERR_NOTFOUND, "no job %llu", (unsigned long long)id);
    goto fail;
  }
  int which = state == 3 ? ST_SET_STARTED : jobs_db_terminal(state) ? ST_SET_FINISHED : -1;
  if (which >= 0) {
    s = stmt(db, which);
    sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
    sqlite3_bind_double(s, 2, now);
    TRY_GOTO(run_done(db, which, "stamping a job"), rc, fail);
  }
  TRY_GOTO(add_transition(db, id, state, reason, now), rc, fail);
  return commit(db);
fail:
  rollback(db);
  return rc;
}

fsdp_status jobs_db_add_step(jobs_db *db, uint64_t id, const jobs_db_step *st, const char *json) {
  fsdp_status rc;
  TRY(begin(db));
  sqlite3_stmt *s = stmt(db, ST_ADD_STEP);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  sqlite3_bind_int(s, 2, st->step);
  sqlite3_bind_double(s, 3, st->loss);
  sqlite3_bind_double(s, 4, st->lr);
  sqlite3_bind_double(s, 5, st->grad_norm);
  sqlite3_bind_int64(s, 6, (sqlite3_int64)st->tokens);
  sqlite3_bind_double(s, 7, st->step_ms);
  sqlite3_bind_double(s, 8, st->tokens_per_s);
  sqlite3_bind_text(s, 9, nz(json), -1, SQLITE_TRANSIENT);
  TRY_GOTO(run_done(db, ST_ADD_STEP, "recording a step"), rc, fail);
  s = stmt(db, ST_PROGRESS);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  sqlite3_bind_int(s, 2, st->step);
  sqlite3_bind_double(s, 3, st->loss);
  sqlite3_bind_double(s, 4, st->tokens_per_s);
  TRY_GOTO(run_done(db, ST_PROGRESS, "updating a job's progress"), rc, fail);
  return commit(db);
fail:
  rollback(db);
  return rc;
}

static char *col_dup(sqlite3_stmt *s, int c) {
  const unsigned char *t = sqlite3_column_text(s, c);
  return strdup(t ? (const char *)t : "");
}

static fsdp_status read_row(sqlite3_stmt *s, jobs_db_row *r) {
  memset(r, 0, sizeof *r);
  r->id = (uint64_t)sqlite3_column_int64(s, 0);
  r->name = col_dup(s, 1);
  r->state = sqlite3_column_int(s, 2);
  r->reason = col_dup(s, 3);
  r->world = sqlite3_column_int(s, 4);
  r->device = sqlite3_column_int(s, 5);
  r->steps = sqlite3_column_int(s, 6);
  r->step = sqlite3_column_int(s, 7);
  r->loss = sqlite3_column_double(s, 8);
  r->tokens_per_s = sqlite3_column_double(s, 9);
  r->spec_text = col_dup(s, 10);
  r->spec_path = col_dup(s, 11);
  r->base_dir = col_dup(s, 12);
  r->job_dir = col_dup(s, 13);
  r->submitted_at = sqlite3_column_double(s, 14);
  r->started_at = sqlite3_column_double(s, 15);
  r->finished_at = sqlite3_column_double(s, 16);
  r->last_lr = sqlite3_column_double(s, 17);
  r->last_grad_norm = sqlite3_column_double(s, 18);
  r->last_step_ms = sqlite3_column_double(s, 19);
  r->last_tokens = (uint64_t)sqlite3_column_int64(s, 20);
  r->owner_uid = sqlite3_column_int64(s, 21);
  r->owner_gid = sqlite3_column_int64(s, 22);
  r->owner = col_dup(s, 23);
  r->umask = sqlite3_column_int(s, 24);
  if (!r->owner || !r->name || !r->reason || !r->spec_text || !r->spec_path || !r->base_dir || !r->job_dir) {
    jobs_db_row_clear(r);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot copy a job row");
  }
  return FSDP_OK;
}

void jobs_db_row_clear(jobs_db_row *r) {
  if (!r) return;
  free(r->name);
  free(r->reason);
  free(r->spec_text);
  free(r->spec_path);
  free(r->base_dir);
  free(r->job_dir);
  free(r->owner);
  memset(r, 0, sizeof *r);
}

fsdp_status jobs_db_get(jobs_db *db, uint64_t id, jobs_db_row *out) {
  sqlite3_stmt *s = stmt(db, ST_GET);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  int rc = sqlite3_step(s);
  fsdp_status st;
  if (rc == SQLITE_ROW) st = read_row(s, out);
  else if (rc == SQLITE_DONE) st = fsdp_set_error(FSDP_ERR_NOTFOUND, "no job %llu", (unsigned long long)id);
  else st = db_fail(db, "reading a job");
  sqlite3_reset(s);
  return st;
}

/* The rows statement WHICH yields, LIMIT bound as ?1 when not 0. */
static fsdp_status list_rows(jobs_db *db, int which, uint32_t limit, jobs_db_row **rows, size_t *n) {
  *rows = NULL;
  *n = 0;
  sqlite3_stmt *s = stmt(db, which);
  if (limit) sqlite3_bind_int64(s, 1, limit);
  size_t cap = 0;
  fsdp_status st = FSDP_OK;
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == cap) {
      cap = cap ? 2 * cap : 16;
      jobs_db_row *nr = realloc(*rows, cap * sizeof *nr);
      if (!nr) {
        st = fsdp_set_error(FSDP_ERR_NOMEM, "cannot list %zu jobs", cap);
        break;
      }
      *rows = nr;
    }
    if ((st = read_row(s, &(*rows)[*n])) != FSDP_OK) break;
    (*n)++;
  }
  if (st == FSDP_OK && rc != SQLITE_DONE) st = db_fail(db, "listing jobs");
  sqlite3_reset(s);
  if (st != FSDP_OK) jobs_db_rows_destroy(rows, *n), *n = 0;
  return st;
}

fsdp_status jobs_db_list(jobs_db *db, uint32_t limit, jobs_db_row **rows, size_t *n) {
  return list_rows(db, limit ? ST_LIST : ST_LIST_ALL, limit, rows, n);
}

fsdp_status jobs_db_list_running_first(jobs_db *db, uint32_t limit, jobs_db_row **rows, size_t *n) {
  return list_rows(db, ST_LIST_RUN_FIRST, limit ? limit : UINT32_MAX, rows, n);
}

fsdp_status jobs_db_state_counts(jobs_db *db, uint32_t counts[JOBS_DB_NSTATES]) {
  memset(counts, 0, JOBS_DB_NSTATES * sizeof *counts);
  sqlite3_stmt *s = stmt(db, ST_STATE_COUNTS);
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    int state = sqlite3_column_int(s, 0);
    if (state >= 0 && state < JOBS_DB_NSTATES) counts[state] = (uint32_t)sqlite3_column_int64(s, 1);
  }
  fsdp_status st = rc == SQLITE_DONE ? FSDP_OK : db_fail(db, "counting jobs");
  sqlite3_reset(s);
  return st;
}

void jobs_db_rows_destroy(jobs_db_row **rows, size_t n) {
  if (!rows || !*rows) return;
  for (size_t i = 0; i < n; i++) jobs_db_row_clear(&(*rows)[i]);
  free(*rows);
  *rows = NULL;
}

fsdp_status jobs_db_fail_started(jobs_db *db, const char *reason, double now, int *count) {
  *count = 0;
  uint64_t ids[256];
  for (;;) {   /* in batches, since set_state reuses statements while ST_STARTED is open */
    int n = 0, rc;
    sqlite3_stmt *s = stmt(db, ST_STARTED);
    while (n < 256 && (rc = sqlite3_step(s)) == SQLITE_ROW) ids[n++] = (uint64_t)sqlite3_column_int64(s, 0);
    sqlite3_reset(s);
    if (n == 0) return FSDP_OK;
    for (int i = 0; i < n; i++) {
      TRY(jobs_db_set_state(db, ids[i], 5, reason, now));
      (*count)++;
    }
  }
}

fsdp_status jobs_db_transitions(jobs_db *db, uint64_t id, int *states, double *at, size_t max, size_t *n) {
  *n = 0;
  sqlite3_stmt *s = stmt(db, ST_TRANSITIONS);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  int rc;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW && *n < max) {
    states[*n] = sqlite3_column_int(s, 0);
    at[*n] = sqlite3_column_double(s, 1);
    (*n)++;
  }
  fsdp_status st = (rc == SQLITE_ROW || rc == SQLITE_DONE) ? FSDP_OK : db_fail(db, "reading transitions");
  sqlite3_reset(s);
  return st;
}

fsdp_status jobs_db_step_json(jobs_db *db, uint64_t id, int step, char **json) {
  *json = NULL;
  sqlite3_stmt *s = stmt(db, ST_STEP_JSON);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  sqlite3_bind_int(s, 2, step);
  int rc = sqlite3_step(s);
  fsdp_status st = FSDP_OK;
  if (rc == SQLITE_ROW) {
    *json = col_dup(s, 0);
    if (!*json) st = fsdp_set_error(FSDP_ERR_NOMEM, "cannot copy a metrics line");
  } else if (rc == SQLITE_DONE) {
    st = fsdp_set_error(FSDP_ERR_NOTFOUND, "job %llu has no step %d", (unsigned long long)id, step);
  } else {
    st = db_fail(db, "reading a step");
  }
  sqlite3_reset(s);
  return st;
}

fsdp_status jobs_db_last_val(jobs_db *db, uint64_t id, int *step, double *val_loss) {
  sqlite3_stmt *s = stmt(db, ST_LAST_VAL);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  int rc = sqlite3_step(s);
  fsdp_status st = FSDP_OK;
  *step = 0;
  *val_loss = 0;
  if (rc == SQLITE_ROW) {
    *step = sqlite3_column_int(s, 0);
    *val_loss = sqlite3_column_double(s, 1);
  } else if (rc != SQLITE_DONE) {
    st = db_fail(db, "reading the validation loss");
  }
  sqlite3_reset(s);
  return st;
}

fsdp_status jobs_db_step_count(jobs_db *db, uint64_t id, int *count) {
  sqlite3_stmt *s = stmt(db, ST_STEP_COUNT);
  sqlite3_bind_int64(s, 1, (sqlite3_int64)id);
  int rc = sqlite3_step(s);
  *count = rc == SQLITE_ROW ? sqlite3_column_int(s, 0) : 0;
  fsdp_status st = rc == SQLITE_ROW ? FSDP_OK : db_fail(db, "counting steps");
  sqlite3_reset(s);
  return st;
}
