/* coord_core — see coord_core.h. */
#include "coord_core.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "fsutil.h"
#include "log.h"
#include "oneline.h"

/* Append one timestamped line to DIR/job.log, the coordinator's record of a job. */
void coord_job_log(const char *dir, const char *fmt, ...) {
  char path[PATH_MAX + 128], line[2048];
  snprintf(path, sizeof path, "%s/job.log", dir);
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  struct tm tm;
  gmtime_r(&ts.tv_sec, &tm);
  int n = (int)strftime(line, sizeof line, "%Y-%m-%dT%H:%M:%SZ ", &tm);
  va_list ap;
  va_start(ap, fmt);
  n += vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
  va_end(ap);
  if (n > (int)sizeof line - 2) n = (int)sizeof line - 2;
  line[n++] = '\n';
  int fd;
  if (fsutil_open_append(AT_FDCWD, path, path, 0644, &fd) != FSDP_OK) {
    log_warn("%s", fsdp_last_error());
    return;
  }
  if (write(fd, line, (size_t)n) < 0) log_warn("cannot write %s: %s", path, strerror(errno));
  close(fd);
}

static void env_ident(wire_env *env, const uint8_t *ident, size_t len) {
  env->n = 0;
  wire_env_push(env, ident, len);
  wire_env_push(env, NULL, 0);
}

void coord_send(coord_t *c, const uint8_t *ident, size_t len, Fsdp__Msg *m) {
  wire_env env;
  env_ident(&env, ident, len);
  fsdp_status rc = wire_send(c->cluster, &env, m, ZMQ_DONTWAIT);
  if (rc != FSDP_OK)
    log_warn("cannot send %s on the cluster socket: %s", wire_body_name(m->body_case),
             rc == FSDP_ERR_TIMEOUT ? "peer queue full" : fsdp_last_error());
}

void coord_reply(void *sock, const wire_env *env, Fsdp__Msg *m) {
  fsdp_status rc = wire_send(sock, env, m, ZMQ_DONTWAIT);
  /* A requester gone before its answer (a client killed mid-request, or one that sends and closes,
   * as a flood of garbage does) is no fault of the daemon's: debug only, so it cannot fill the log. */
  if (rc != FSDP_OK && rc != FSDP_ERR_TIMEOUT) {
    if (zmq_errno() == EHOSTUNREACH) log_debug("cannot send %s: %s", wire_body_name(m->body_case), fsdp_last_error());
    else log_warn("cannot send %s: %s", wire_body_name(m->body_case), fsdp_last_error());
  }
}

void coord_reply_error(void *sock, const wire_env *env, fsdp_status code, const char *msg) {
  Fsdp__Error e = FSDP__ERROR__INIT;
  e.code = (uint32_t)code;
  /* one line: a path or a peer's text in it, newlines and escape sequences included, is escaped */
  char line[4096];
  oneline_escape_str(line, sizeof line, msg ? msg : "");
  e.message = line;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_ERROR;
  m.error = &e;
  coord_reply(sock, env, &m);
}

void coord_reply_ack(void *sock, const wire_env *env) {
  Fsdp__Ack a = FSDP__ACK__INIT;
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_ACK;
  m.ack = &a;
  coord_reply(sock, env, &m);
}


static uint32_t ident_hash(const uint8_t *id, size_t len) {
  uint32_t h = 2166136261u;   /* FNV-1a */
  for (size_t i = 0; i < len; i++) h = (h ^ id[i]) * 16777619u;
  return h;
}

/* Every node's ident in an open-addressing table twice as large as the nodes: one node report per
 * node per step makes a linear search O(nodes²) per step. */
static void node_hash_build(coord_t *c) {
  int cap = 16;
  while (cap < 2 * c->nnodes) cap *= 2;
  int *h = malloc((size_t)cap * sizeof *h);
  if (!h) return;   /* the linear search still answers */
  for (int i = 0; i < cap; i++) h[i] = -1;
  for (int i = 0; i < c->nnodes; i++) {
    uint32_t k = ident_hash(c->nodes[i].ident, c->nodes[i].ident_len) & (uint32_t)(cap - 1);
    while (h[k] >= 0) k = (k + 1) & (uint32_t)(cap - 1);
    h[k] = i;
  }
  free(c->node_hash);
  c->node_hash = h;
  c->node_hash_cap = cap;
  c->node_hash_stale = 0;
}

node_t *coord_find_node(coord_t *c, const uint8_t *id, size_t len) {
  if (c->node_hash_stale || c->node_hash_cap < 2 * c->nnodes) node_hash_build(c);
  if (c->node_hash) {
    uint32_t k = ident_hash(id, len) & (uint32_t)(c->node_hash_cap - 1);
    for (; c->node_hash[k] >= 0; k = (k + 1) & (uint32_t)(c->node_hash_cap - 1)) {
      node_t *n = &c->nodes[c->node_hash[k]];
      if (n->ident_len == len && !memcmp(n->ident, id, len)) return n;
    }
  }
  for (int i = 0; i < c->nnodes; i++)   /* an ident changed since the table was built */
    if (c->nodes[i].ident_len == len && !memcmp(c->nodes[i].ident, id, len)) {
      c->node_hash_stale = 1;
      return &c->nodes[i];
    }
  return NULL;
}



void coord_open_socket_file(const char *ep) {
  if (geteuid() != 0 || strncmp(ep, "ipc://", 6)) return;
  if (chmod(ep + 6, 0666) != 0) log_warn("cannot make %s connectable by its users: %s", ep + 6, strerror(errno));
}

void coord_note_bad(coord_t *c, const char *where, const char *why) {
  c->bad_msgs++;
  double now = loop_now_mono();
  if (c->bad_logged_at > 0 && now - c->bad_logged_at < BAD_LOG_EVERY_S) {
    c->bad_unlogged++;
    return;
  }
  if (c->bad_unlogged)
    log_warn("%s: dropped a malformed message (%llu so far; %llu more since the last such line were not logged): %s", where,
             (unsigned long long)c->bad_msgs, (unsigned long long)c->bad_unlogged, why);
  else
    log_warn("%s: dropped a malformed message (%llu so far): %s", where, (unsigned long long)c->bad_msgs, why);
  c->bad_unlogged = 0;
  c->bad_logged_at = now;
}

int coord_ranks_per_node(const coord_t *c, int kind, int world) {
  int most = 0;
  for (int i = 0; c && i < c->nnodes; i++) {
    if (c->nodes[i].lost) continue;
    int n = 0;
    for (int s = 0; s < c->nodes[i].nslots; s++) n += c->nodes[i].slots[s].kind == kind;
    if (n > most) most = n;
  }
  return most < world ? most : world;
}

const char *coord_kind_name(int kind) { return kind == FSDP__DEVICE_KIND__DEVICE_KIND_CUDA ? "GPUs" : "CPU slots"; }


