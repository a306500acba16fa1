/* logcfg — see logcfg.h. */
#include "logcfg.h"

#include <fcntl.h>
#include <string.h>

#include "fsutil.h"

fsdp_status log_parse_level(const char *s, log_level *out) {
  static const char *names[] = {"debug", "info", "warn", "error"};
  for (int i = 0; i < 4; i++)
    if (strcmp(s, names[i]) == 0) {
      *out = (log_level)i;
      return FSDP_OK;
    }
  return fsdp_set_error(FSDP_ERR_INVALID, "unknown log level '%s' (allowed: debug, info, warn, error)", s);
}

fsdp_status log_open_file(const char *path) {
  int fd;
  TRY(fsutil_open_append(AT_FDCWD, path, path, 0644, &fd));   /* never through a link */
  log_set_fd(fd);
  return FSDP_OK;
}
