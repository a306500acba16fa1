/* log — see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "oneline.h"

static log_level cur_level = LOG_INFO;
static char prefix[64] = "fsdp";
static int log_fd = 2;

void log_set_level(log_level lvl) { cur_level = lvl; }

void log_set_prefix(const char *component, int rank) {
  if (rank >= 0)
    snprintf(prefix, sizeof prefix, "%s[%d]", component, rank);
  else
    snprintf(prefix, sizeof prefix, "%s", component);
}

void log_set_fd(int fd) {
  if (log_fd > 2) close(log_fd);
  log_fd = fd;
}

void log_emit(log_level lvl, const char *file, int line, const char *fmt, ...) {
  static const char *tags[] = {"DEBUG", "INFO ", "WARN ", "ERROR"};
  if (lvl < cur_level) return;
  char msg[2048], buf[4096];   /* the message, then its line: room for its escapes */
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s ", tm.tm_year + 1900,
                   tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
                   tags[lvl], prefix);
  if (lvl == LOG_DEBUG) {
    const char *base = strrchr(file, '/');
    n += snprintf(buf + n, sizeof buf - (size_t)n, "%s:%d: ", base ? base + 1 : file, line);
  }
  va_list ap;
  va_start(ap, fmt);
  int m = vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  size_t ml = m < 0 ? 0 : (size_t)m < sizeof msg ? (size_t)m : sizeof msg - 1;
  /* One line whatever the message holds: a path or a peer's text with a newline cannot forge an
   * entry, nor an escape sequence drive whoever reads the log on a terminal. */
  size_t len = (size_t)n + oneline_escape(buf + n, sizeof buf - (size_t)n - 1, msg, ml);
  buf[len++] = '\n';
  ssize_t w = write(log_fd, buf, len); /* one write per line keeps lines whole across threads */
  (void)w;
}
