/* log — leveled log lines with a timestamp, a component and an optional rank prefix.
 *
 *   2026-11-29T08:31:02.123Z INFO  worker[1] gathered unit 3 (1.2 MiB)
 *
 * A message is always one line: its control characters are escaped (oneline.h), so text from
 * elsewhere in it cannot forge a line. Output goes to stderr unless log_set_fd() (logcfg.h's
 * log_open_file) redirects it. The settings are process-global and meant to be set once at start-up
 * from main(); emitting a line is thread-safe (one write per line). Nothing here fails, so log sits
 * below err, which logs every error it records; the settings that can fail are logcfg.h's.
 */
#ifndef FSDP_LOG_H
#define FSDP_LOG_H

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level;

void log_set_level(log_level lvl);
/* Component ("fsdpd", "worker", ...) and rank (-1 for none) put before every message. */
void log_set_prefix(const char *component, int rank);
/* Write to FD (taken: closed when replaced, unless 0..2) instead of stderr. */
void log_set_fd(int fd);

void log_emit(log_level lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_debug(...) log_emit(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...) log_emit(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...) log_emit(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_emit(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
