/* logcfg — the log's settings from a command line or a config file: a level by its name, a file to
 * append to. Apart from log.h because these can fail (err.h), and err logs every error it records:
 * log stays below err, these above it. Called from main() at start-up, as log.h's setters.
 */
#ifndef FSDP_LOGCFG_H
#define FSDP_LOGCFG_H

#include "err.h"
#include "log.h"

/* Parse "debug", "info", "warn" or "error". */
fsdp_status log_parse_level(const char *s, log_level *out);
/* Append to PATH instead of stderr (never through a link). */
fsdp_status log_open_file(const char *path);

#endif
