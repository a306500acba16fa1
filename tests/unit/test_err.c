/* test_err — status strings, the per-thread last error, TRY/TRY_GOTO, and log lines. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "oneline.h"
#include "log.h"
#include "logcfg.h"

static fsdp_status fails(void) { return fsdp_set_error(FSDP_ERR_RANGE, "x is %d, allowed 0..3", 7); }
static fsdp_status via_try(void) {
  TRY(fails());
  return FSDP_OK;
}
static fsdp_status via_goto(int *cleaned) {
  fsdp_status rc = FSDP_OK;
  TRY_GOTO(fails(), rc, out);
  rc = FSDP_ERR_INTERNAL; /* not reached */
out:
  *cleaned = 1;
  return rc;
}

static void *other_thread(void *arg) {
  (void)arg;
  fsdp_clear_error();
  /* A fresh thread has no message of its own: it sees the generic text, not main's message. */
  return (void *)(intptr_t)(strcmp(fsdp_last_error(), "success") == 0);
}

/* Messages are for people: no source location in them; the location is kept apart for logs. */
static void test_message_and_location(void) {
  fsdp_set_error(FSDP_ERR_INVALID, "bad thing");
  CHECK(!strcmp(fsdp_last_error(), "bad thing"));
  CHECK(!strncmp(fsdp_last_error_where(), "test_err.c:", 11));
  /* A message that wraps the previous one, as callers do ("cannot resume: %s"). Formatting read
   * the thread's buffer while writing it: "unreadable reply from X: unreadable reply from X: ..." */
  fsdp_set_error(FSDP_ERR_FORMAT, "unpacking Msg failed");
  fsdp_set_error(FSDP_ERR_COMM, "unreadable reply from %s: %s", "ipc:///s/ctl.sock", fsdp_last_error());
  CHECK(!strcmp(fsdp_last_error(), "unreadable reply from ipc:///s/ctl.sock: unpacking Msg failed"));
  fsdp_set_error(FSDP_ERR_COMM, "rank 1: %s", fsdp_last_error());
  CHECK(!strcmp(fsdp_last_error(), "rank 1: unreadable reply from ipc:///s/ctl.sock: unpacking Msg failed"));
  fsdp_clear_error();
  CHECK(!strcmp(fsdp_last_error_where(), ""));
}

int main(void) {
  test_message_and_location();
  for (int s = 0; s < FSDP_STATUS_COUNT; s++) CHECK(strlen(fsdp_strerror((fsdp_status)s)) > 0);
  CHECK(strcmp(fsdp_strerror((fsdp_status)999), "unknown status") == 0);

  CHECK_EQ_INT(FSDP_ERR_RANGE, via_try());
  CHECK(!strcmp(fsdp_last_error(), "x is 7, allowed 0..3"));   /* no location in the message */
  int cleaned = 0;
  CHECK_EQ_INT(FSDP_ERR_RANGE, via_goto(&cleaned));
  CHECK_EQ_INT(1, cleaned);

  pthread_t t;
  void *ok = NULL;
  pthread_create(&t, NULL, other_thread, NULL);
  pthread_join(t, &ok);
  CHECK(ok != NULL);
  CHECK(strstr(fsdp_last_error(), "x is 7") != NULL);   /* main's message is still there */
  fsdp_clear_error();
  CHECK(strcmp(fsdp_last_error(), "success") == 0);

  log_level lvl;
  CHECK_OK(log_parse_level("warn", &lvl));
  CHECK_EQ_INT(LOG_WARN, lvl);
  CHECK_EQ_INT(FSDP_ERR_INVALID, log_parse_level("loud", &lvl));
  CHECK(strstr(fsdp_last_error(), "allowed: debug, info, warn, error") != NULL);

  /* Log lines go to a file with level, prefix and rank; lines below the level are dropped. */
  char path[] = "/tmp/fsdp-test-log-XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  close(fd);
  CHECK_OK(log_open_file(path));
  log_set_prefix("worker", 3);
  log_set_level(LOG_INFO);
  log_debug("hidden %d", 1);
  log_info("gathered unit %d", 5);
  log_error("peer %s silent", "r1");
  /* text from elsewhere with newlines and an escape sequence: one line, nothing forged */
  log_warn("cannot read %s", "a\n2026-01-01T00:00:00.000Z INFO  worker[3] forged\r\x1b[2J\xc2\x9b.ini");
  FILE *f = fopen(path, "r");
  char buf[4096] = {0};
  size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  CHECK(n > 0);
  CHECK(strstr(buf, "hidden") == NULL);
  CHECK(strstr(buf, "INFO  worker[3] gathered unit 5\n") != NULL);
  CHECK(strstr(buf, "ERROR worker[3] peer r1 silent\n") != NULL);
  CHECK(buf[4] == '-' && buf[10] == 'T');   /* ISO 8601 timestamp first */
  CHECK(strstr(buf, "WARN  worker[3] cannot read a\\n2026-01-01T00:00:00.000Z INFO  worker[3] forged\\r\\x1b[2J\\u009b.ini\n") != NULL);
  CHECK(strstr(buf, "\nforged") == NULL && strstr(buf, "\n2026-01-01") == NULL && strchr(buf, 0x1b) == NULL);
  int lines = 0;
  for (char *p = buf; *p; p++) lines += *p == '\n';
  CHECK_EQ_INT(3, lines);

  /* oneline: every control character escaped, other UTF-8 kept, an escape never cut in half */
  char esc[64];
  CHECK_EQ_INT(24, (int)oneline_escape_str(esc, sizeof esc, "a\tb\x01\x7f\xc2\x85 \xc3\xa9 \\n"));
  CHECK(!strcmp(esc, "a\\tb\\x01\\x7f\\u0085 \xc3\xa9 \\n"));
  CHECK_EQ_INT(3, (int)oneline_escape_str(esc, 5, "x\n\n"));   /* 5 bytes hold "x\\n" and the NUL, not half of the next */
  CHECK(!strcmp(esc, "x\\n"));
  CHECK_EQ_INT(5, (int)oneline_escape(esc, sizeof esc, "\0z", 2));
  CHECK(!strcmp(esc, "\\x00z"));
  CHECK(oneline_clean("plain text, caf\xc3\xa9") && !oneline_clean("a\nb") && !oneline_clean("\xc2\x9b"));
  unlink(path);
  return check_done();
}
