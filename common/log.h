/* log — leveled log lines with a timestamp, a component and an optional rank prefix.
 *
 *   2026-11-29T08:31:02.123Z INFO  worker[1] gathered unit 3 (1.2 MiB)
 *
 * A message is always one line: its control characters are escaped (oneline.h), so text from
 * elsewhere in it cannot forge a line. Output goes to stderr unless log_open_file() redirects it. The settings are process-global and
 * meant to be set once at start-up from main(); emitting a line is thread-safe (one write per line).
 */
#ifndef FSDP_LOG_H
#define FSDP_LOG_H

#include "err.h"

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } log_level;

void log_set_level(log_level lvl);
/* Parse "debug", "info", "warn" or "error". */
fsdp_status log_parse_level(const char *s, log_level *out);
/* Component ("fsdpd", "worker", ...) and rank (-1 for none) put before every message. */
void log_set_prefix(const char *component, int rank);
/* Append to PATH instead of stderr. */
fsdp_status log_open_file(const char *path);

void log_emit(log_level lvl, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define log_debug(...) log_emit(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...) log_emit(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...) log_emit(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_emit(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
