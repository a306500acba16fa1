/* metricsrv — see metricsrv.h. */
#define _GNU_SOURCE
#include "metricsrv.h"

#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdarg.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "log.h"

/* Connections: libmicrohttpd accepts up to MAX_CONNS; past KEEP_CONNS open, each new connection
 * evicts the connection that has waited longest without a request being answered (slow headers,
 * idle keep-alives), by shutting its socket down so that libmicrohttpd closes it on its next poll.
 * A raised limit alone would not help: an attacker and the scraper share an address. A scraper
 * sends its request at once and is answered within a poll, so it is never the oldest idle one. */
#define MAX_CONNS 256
#define KEEP_CONNS 48
#define CONN_TIMEOUT_S 10u
/* libmicrohttpd's own messages (a 70 kB URL, a malformed request) are logged at most once per
 * LOG_EVERY_S seconds, with the number suppressed since: a flood cannot fill the log. */
#define LOG_EVERY_S 30

typedef struct conn_slot {
  struct MHD_Connection *conn;   /* NULL: free */
  int fd;
  double idle_since;             /* when it last started waiting for a request */
  int answering;                 /* a request is being answered: never evicted */
} conn_slot;

struct metricsrv {
  int fd;                      /* the listening socket; libmicrohttpd closes it once started */
  conn_slot conns[MAX_CONNS];  /* touched only by libmicrohttpd's polling thread */
  int nconns;
  unsigned long evicted;
  double log_last;             /* when libmicrohttpd's last message was logged (its thread only) */
  unsigned long log_dropped;
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

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static conn_slot *slot_of(metricsrv_t *m, struct MHD_Connection *conn) {
  for (int i = 0; i < MAX_CONNS; i++)
    if (m->conns[i].conn == conn) return &m->conns[i];
  return NULL;
}

/* Shut down the connection other than KEEP that has waited longest without being answered. */
static void evict_oldest_idle(metricsrv_t *m, const conn_slot *keep) {
  conn_slot *old = NULL;
  for (int i = 0; i < MAX_CONNS; i++) {
    conn_slot *c = &m->conns[i];
    if (c->conn && c != keep && !c->answering && c->fd >= 0 && (!old || c->idle_since < old->idle_since)) old = c;
  }
  if (!old) return;
  shutdown(old->fd, SHUT_RDWR);
  old->fd = -1;   /* shut once; libmicrohttpd closes it and tells notify_conn */
  m->evicted++;
}

static void notify_conn(void *cls, struct MHD_Connection *conn, void **socket_ctx, enum MHD_ConnectionNotificationCode code) {
  (void)socket_ctx;
  metricsrv_t *m = cls;
  if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
    conn_slot *c = slot_of(m, conn);
    if (c) c->conn = NULL, m->nconns--;
    return;
  }
  conn_slot *c = slot_of(m, NULL);
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (!c || !ci) return;   /* cannot happen: MAX_CONNS slots for MAX_CONNS connections */
  *c = (conn_slot){.conn = conn, .fd = ci->connect_fd, .idle_since = mono_s()};
  if (++m->nconns > KEEP_CONNS) evict_oldest_idle(m, c);
}

/* A request is done (answered, or its connection failed): the connection waits again. */
static void request_done(void *cls, struct MHD_Connection *conn, void **req, enum MHD_RequestTerminationCode code) {
  (void)req, (void)code;
  conn_slot *c = slot_of(cls, conn);
  if (c) c->answering = 0, c->idle_since = mono_s();
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  metricsrv_t *m = cls;
  double now = mono_s();
  if (m->log_last > 0 && now - m->log_last < LOG_EVERY_S) {
    m->log_dropped++;
    return;
  }
  char line[256];
  vsnprintf(line, sizeof line, fmt, ap);
  line[strcspn(line, "\n")] = '\0';
  if (m->log_dropped)
    log_warn("metrics endpoint: %.200s (%lu similar messages in the last %d s not logged)", line, m->log_dropped, LOG_EVERY_S);
  else log_warn("metrics endpoint: %.200s", line);
  m->log_last = now, m->log_dropped = 0;
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                              const char *version, const char *upload, size_t *upload_len, void **req) {
  (void)version, (void)upload, (void)upload_len, (void)req;
  metricsrv_t *m = cls;
  conn_slot *slot = slot_of(m, conn);
  if (slot) slot->answering = 1;
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
  if (code == MHD_HTTP_METHOD_NOT_ALLOWED) MHD_add_response_header(resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          code == MHD_HTTP_OK ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain");
  enum MHD_Result r = MHD_queue_response(conn, code, resp);
  MHD_destroy_response(resp);
  return r;
}

fsdp_status metricsrv_start(metricsrv_t *m) {
  /* One polling thread (epoll: many idle sockets cost nothing) is plenty for a scrape every few
   * seconds; a silent client is cut after CONN_TIMEOUT_S, and sooner when others need its place. */
  for (int i = 0; i < MAX_CONNS; i++) m->conns[i].conn = NULL;
  m->mhd = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_USE_ERROR_LOG, 0, NULL, NULL, answer, m,
                            MHD_OPTION_LISTEN_SOCKET, (MHD_socket)m->fd, MHD_OPTION_CONNECTION_TIMEOUT, CONN_TIMEOUT_S,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)MAX_CONNS, MHD_OPTION_NOTIFY_CONNECTION, notify_conn, m,
                            MHD_OPTION_NOTIFY_COMPLETED, request_done, m, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, m,
                            MHD_OPTION_END);
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
  if (m->mhd) MHD_stop_daemon(m->mhd);
  if (m->evicted) log_info("metrics endpoint: %lu idle connections were closed to make room", m->evicted);   /* joins the thread; the listening socket is closed with it */
  if (m->fd >= 0) close(m->fd);
  pthread_mutex_destroy(&m->mu);
  free(m->text);
  free(m);
}
