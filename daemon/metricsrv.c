/* metricsrv — see metricsrv.h. */
#define _GNU_SOURCE
#include "metricsrv.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"

struct metricsrv {
  int fd;                      /* the listening socket; libmicrohttpd closes it once started */
  struct MHD_Daemon *mhd;
  char where[300];             /* "HOST:PORT", for messages */
  pthread_mutex_t mu;          /* guards text and len */
  char *text;
  size_t len;
};

fsdp_status metricsrv_parse(const char *spec, char *host, size_t hostlen, int *port) {
  const char *p = spec;
  size_t hl = 0;
  const char *h = NULL;
  if (!spec || !*spec) return fsdp_set_error(FSDP_ERR_INVALID, "--metrics: expected HOST:PORT, :PORT or PORT");
  if (*spec == '[') {
    const char *close = strchr(spec, ']');
    if (!close || close[1] != ':')
      return fsdp_set_error(FSDP_ERR_INVALID, "--metrics %s: expected [IPV6-ADDRESS]:PORT", spec);
    h = spec + 1;
    hl = (size_t)(close - h);
    p = close + 2;
  } else if (strchr(spec, ':')) {
    const char *colon = strrchr(spec, ':');
    h = spec;
    hl = (size_t)(colon - spec);
    p = colon + 1;
  }
  char *end;
  errno = 0;
  long v = strtol(p, &end, 10);
  if (!*p || *end || errno || v < 1 || v > 65535)
    return fsdp_set_error(FSDP_ERR_INVALID, "--metrics %s: the port must be a number in 1..65535", spec);
  if (h && hl == 0 && *spec == '[') return fsdp_set_error(FSDP_ERR_INVALID, "--metrics %s: empty address", spec);
  if (!h || hl == 0) {
    h = "127.0.0.1";
    hl = strlen(h);
  }
  if (hl + 1 > hostlen) return fsdp_set_error(FSDP_ERR_INVALID, "--metrics %s: the host is too long", spec);
  memcpy(host, h, hl);
  host[hl] = '\0';
  *port = (int)v;
  return FSDP_OK;
}

fsdp_status metricsrv_bind(const char *host, int port, metricsrv_t **out) {
  *out = NULL;
  char ps[16];
  snprintf(ps, sizeof ps, "%d", port);
  struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV | AI_PASSIVE};
  struct addrinfo *ai = NULL;
  int g = getaddrinfo(host, ps, &hints, &ai);
  if (g != 0) return fsdp_set_error(FSDP_ERR_INVALID, "--metrics %s:%d: cannot resolve %s: %s", host, port, host, gai_strerror(g));
  int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    int e = errno;
    freeaddrinfo(ai);
    return fsdp_set_error(FSDP_ERR_IO, "--metrics %s:%d: socket: %s", host, port, strerror(e));
  }
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);   /* a restart need not wait out TIME_WAIT */
  if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 64) != 0) {
    int e = errno;
    freeaddrinfo(ai);
    close(fd);
    if (e == EADDRINUSE)
      return fsdp_set_error(FSDP_ERR_IO, "--metrics %s:%d: the port is already in use; pick another port", host, port);
    return fsdp_set_error(FSDP_ERR_IO, "--metrics %s:%d: cannot listen: %s", host, port, strerror(e));
  }
  freeaddrinfo(ai);
  metricsrv_t *m = calloc(1, sizeof *m);
  if (!m) {
    close(fd);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the metrics server");
  }
  m->fd = fd;
  snprintf(m->where, sizeof m->where, "%s:%d", host, port);
  pthread_mutex_init(&m->mu, NULL);
  *out = m;
  return FSDP_OK;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_len, void **req) {
  (void)version, (void)upload, (void)upload_len, (void)req;
  metricsrv_t *m = cls;
  static const char not_found[] = "not found: fsdpd serves /metrics\n";
  static const char no_method[] = "only GET and HEAD\n";
  struct MHD_Response *resp;
  unsigned code = MHD_HTTP_OK;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    code = MHD_HTTP_METHOD_NOT_ALLOWED;
    resp = MHD_create_response_from_buffer(sizeof no_method - 1, (void *)no_method, MHD_RESPMEM_PERSISTENT);
  } else if (strcmp(url, "/metrics") != 0) {
    code = MHD_HTTP_NOT_FOUND;
    resp = MHD_create_response_from_buffer(sizeof not_found - 1, (void *)not_found, MHD_RESPMEM_PERSISTENT);
  } else {
    pthread_mutex_lock(&m->mu);
    resp = MHD_create_response_from_buffer(m->len, m->text ? m->text : (void *)"", MHD_RESPMEM_MUST_COPY);
    pthread_mutex_unlock(&m->mu);
  }
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain");
  enum MHD_Result r = MHD_queue_response(conn, code, resp);
  MHD_destroy_response(resp);
  return r;
}

fsdp_status metricsrv_start(metricsrv_t *m) {
  /* One polling thread is plenty for a scrape every few seconds; a slow client is cut after 10 s. */
  m->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, 0, NULL, NULL, answer, m,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)m->fd, MHD_OPTION_CONNECTION_TIMEOUT, 10u,
                            MHD_OPTION_CONNECTION_LIMIT, 64u, MHD_OPTION_END);
  if (!m->mhd) return fsdp_set_error(FSDP_ERR_IO, "--metrics %s: libmicrohttpd could not start", m->where);
  m->fd = -1;   /* the daemon's now */
  log_info("serving Prometheus metrics on http://%s/metrics", m->where);
  return FSDP_OK;
}

fsdp_status metricsrv_publish(metricsrv_t *m, const char *text, size_t len) {
  char *copy = malloc(len + 1);
  if (!copy) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot copy %zu bytes of metrics", len);
  memcpy(copy, text, len);
  copy[len] = '\0';
  pthread_mutex_lock(&m->mu);
  char *old = m->text;
  m->text = copy;
  m->len = len;
  pthread_mutex_unlock(&m->mu);
  free(old);
  return FSDP_OK;
}

void metricsrv_destroy(metricsrv_t **mp) {
  if (!mp || !*mp) return;
  metricsrv_t *m = *mp;
  *mp = NULL;
  if (m->mhd) MHD_stop_daemon(m->mhd);   /* joins the thread; the listening socket is closed with it */
  if (m->fd >= 0) close(m->fd);
  pthread_mutex_destroy(&m->mu);
  free(m->text);
  free(m);
}
