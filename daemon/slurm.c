/* slurm — `fsdpd --slurm`: the node's role, GPUs and name from the allocation (see slurm.h). */
#include "slurm.h"

#include <errno.h>
#include <limits.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#define START_HINT "start it with srun inside sbatch or salloc, one task per node (scripts/slurm/fsdpd.sbatch)"

fsdp_status slurm_first_host(const char *nodelist, char *out, size_t n) {
  size_t len = 0;
  const char *p = nodelist;
  /* Outside brackets every character is the name's; a bracket contributes the start of its first
   * item ("03" of [03-05,7]); the first top-level comma ends the first host. */
  while (*p && *p != ',') {
    const char *from = p, *to = p + 1;
    if (*p == '[') {
      from = ++p;
      while (*p >= '0' && *p <= '9') p++;
      if (p == from || (*p != '-' && *p != ',' && *p != ']'))
        return fsdp_set_error(FSDP_ERR_INVALID, "SLURM_JOB_NODELIST=%s: a bracket must start with a number, as in n[1-3,5]",
                              nodelist);
      to = p;
      while (*p && *p != ']') p++;
      if (!*p) return fsdp_set_error(FSDP_ERR_INVALID, "SLURM_JOB_NODELIST=%s: '[' without ']'", nodelist);
    } else if (*p == ']') {
      return fsdp_set_error(FSDP_ERR_INVALID, "SLURM_JOB_NODELIST=%s: ']' without '['", nodelist);
    }
    p++;
    for (; from < to; from++, len++)
      if (len + 1 < n) out[len] = *from;
  }
  if (len == 0) return fsdp_set_error(FSDP_ERR_INVALID, "SLURM_JOB_NODELIST='%s' names no host", nodelist);
  if (len >= n)
    return fsdp_set_error(FSDP_ERR_RANGE, "SLURM_JOB_NODELIST=%s: its first host's name is longer than %zu bytes", nodelist, n - 1);
  out[len] = '\0';
  return FSDP_OK;
}

static const char *env_get(char *const *envp, const char *name) {
  size_t len = strlen(name);
  for (char *const *e = envp; e && *e; e++)
    if (!strncmp(*e, name, len) && (*e)[len] == '=') return *e + len + 1;
  return NULL;
}

/* An integer in 0..INT_MAX from variable NAME; -1 when it is not set. */
static fsdp_status env_int(char *const *envp, const char *name, int *out) {
  const char *v = env_get(envp, name);
  *out = -1;
  if (!v) return FSDP_OK;
  char *end;
  errno = 0;
  long x = strtol(v, &end, 10);
  if (errno || end == v || *end || x < 0 || x > INT_MAX)
    return fsdp_set_error(FSDP_ERR_INVALID, "%s='%s': expected a non-negative integer", name, v);
  *out = (int)x;
  return FSDP_OK;
}

/* The number of devices CUDA_VISIBLE_DEVICES lists ("" and Slurm's "NoDevFiles" list none). */
static int visible_count(const char *v) {
  if (!*v || !strcmp(v, "NoDevFiles")) return 0;
  int n = 1;
  for (const char *p = v; *p; p++) n += *p == ',';
  return n;
}

fsdp_status slurm_env_read(char *const *envp, slurm_env *out) {
  memset(out, 0, sizeof *out);
  const char *job = env_get(envp, "SLURM_JOB_ID");
  if (!job || !*job)
    return fsdp_set_error(FSDP_ERR_INVALID, "--slurm: SLURM_JOB_ID is not set, so this is not a Slurm allocation; " START_HINT);
  snprintf(out->job_id, sizeof out->job_id, "%s", job);
  TRY(env_int(envp, "SLURM_NODEID", &out->node_id));
  if (out->node_id < 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "--slurm: SLURM_NODEID is not set (Slurm job %s, but not a job step); " START_HINT, job);
  TRY(env_int(envp, "SLURM_JOB_NUM_NODES", &out->nnodes));
  if (out->nnodes < 0) TRY(env_int(envp, "SLURM_NNODES", &out->nnodes));
  if (out->nnodes >= 0 && out->node_id >= out->nnodes)
    return fsdp_set_error(FSDP_ERR_INVALID, "SLURM_NODEID=%d is not below SLURM_JOB_NUM_NODES=%d", out->node_id, out->nnodes);
  int local;
  TRY(env_int(envp, "SLURM_LOCALID", &local));
  if (local > 0)
    return fsdp_set_error(FSDP_ERR_INVALID, "SLURM_LOCALID=%d: fsdpd runs once per node, as local task 0 (srun --ntasks-per-node=1)",
                          local);
  const char *list = env_get(envp, "SLURM_JOB_NODELIST");
  if (!list) list = env_get(envp, "SLURM_NODELIST");
  if (!list || !*list) return fsdp_set_error(FSDP_ERR_INVALID, "--slurm: SLURM_JOB_NODELIST is not set; " START_HINT);
  if (strlen(list) >= sizeof out->nodelist)
    return fsdp_set_error(FSDP_ERR_RANGE, "SLURM_JOB_NODELIST is %zu bytes; at most %zu are supported", strlen(list),
                          sizeof out->nodelist - 1);
  snprintf(out->nodelist, sizeof out->nodelist, "%s", list);
  TRY(slurm_first_host(list, out->first_host, sizeof out->first_host));
  const char *name = env_get(envp, "SLURMD_NODENAME");
  snprintf(out->node_name, sizeof out->node_name, "%s", name ? name : "");

  int on_node;
  TRY(env_int(envp, "SLURM_GPUS_ON_NODE", &on_node));
  const char *vis = env_get(envp, "CUDA_VISIBLE_DEVICES");
  out->visible_set = vis != NULL;
  out->gpus = on_node;
  if (on_node >= 0) snprintf(out->gpus_from, sizeof out->gpus_from, "SLURM_GPUS_ON_NODE=%d", on_node);
  if (vis) {
    int nv = visible_count(vis);
    if (on_node >= 0 && nv != on_node)
      return fsdp_set_error(FSDP_ERR_INVALID, "CUDA_VISIBLE_DEVICES=%s (%d GPUs) contradicts SLURM_GPUS_ON_NODE=%d: "
                            "leave CUDA_VISIBLE_DEVICES to Slurm", vis, nv, on_node);
    if (on_node < 0) snprintf(out->gpus_from, sizeof out->gpus_from, "CUDA_VISIBLE_DEVICES=%.100s", vis);
    out->gpus = nv;
  }
  return FSDP_OK;
}

/* HOST of tcp://HOST:PORT (tcp://[v6]:PORT too) into OUT; 0 when ENDPOINT is not of that form. */
static int tcp_host(const char *endpoint, char *out, size_t n) {
  if (strncmp(endpoint, "tcp://", 6)) return 0;
  const char *h = endpoint + 6, *colon = strrchr(h, ':');
  if (!colon || colon == h || !colon[1]) return 0;
  size_t len = (size_t)(colon - h);
  if (*h == '[' && len >= 2 && h[len - 1] == ']') h++, len -= 2;
  if (len + 1 > n) return 0;
  memcpy(out, h, len);
  out[len] = '\0';
  return 1;
}

/* --gpus against the allocation's N GPUs: all is theirs; a list must name each of 0..N-1 once. */
static fsdp_status resolve_gpus(const slurm_env *env, const char *flag, char *out, size_t n) {
  if (env->gpus < 0) {   /* nothing in the allocation says: the flag as without Slurm */
    snprintf(out, n, "%s", flag && *flag ? flag : "all");
    return FSDP_OK;
  }
  if (!flag || !*flag || !strcmp(flag, "all")) {
    if (env->gpus == 0) snprintf(out, n, "none");
    else if (env->visible_set) snprintf(out, n, "all");   /* the driver shows exactly the allocation's */
    else {
      size_t k = 0;
      out[0] = '\0';
      for (int i = 0; i < env->gpus && k + 12 < n; i++) k += (size_t)snprintf(out + k, n - k, i ? ",%d" : "%d", i);
    }
    return FSDP_OK;
  }
  int count = 0, ok = 1;
  unsigned char seen[256] = {0};
  if (strcmp(flag, "none")) {
    for (const char *p = flag; *p;) {
      char *end;
      long v = strtol(p, &end, 10);
      if (end == p || v < 0 || v >= env->gpus || v >= 256 || seen[v]++) ok = 0;
      count++;
      if (end == p) break;
      if (*end == ',' && !end[1]) ok = 0;   /* a trailing comma: an empty entry */
      p = *end == ',' ? end + 1 : end;
    }
  }
  if (!ok || count != env->gpus)
    return fsdp_set_error(FSDP_ERR_INVALID, "--gpus %s contradicts %s: under --slurm this node offers the allocation's %d GPU%s "
                          "(drop --gpus, or ask Slurm for other GPUs)", flag, env->gpus_from, env->gpus, env->gpus == 1 ? "" : "s");
  snprintf(out, n, "%s", flag);
  return FSDP_OK;
}

fsdp_status slurm_resolve(const slurm_env *env, const slurm_flags *flags, int (*same_host)(const char *, const char *),
                          slurm_role *out) {
  memset(out, 0, sizeof *out);
  int has_join = flags->join && *flags->join;
  out->coordinator = env->node_id == 0;
  if (out->coordinator) {
    if (has_join)
      return fsdp_set_error(FSDP_ERR_INVALID, "--join %s contradicts SLURM_NODEID=0: the allocation's first node (%s) runs "
                            "the coordinator; drop --join there", flags->join, env->first_host);
    const char *listen = flags->listen && *flags->listen ? flags->listen : "the default ipc://STATE/cluster.sock";
    if (env->nnodes > 1 && strncmp(listen, "tcp://", 6))
      return fsdp_set_error(FSDP_ERR_INVALID, "--listen %s contradicts SLURM_JOB_NUM_NODES=%d: the other nodes join over TCP; "
                            "give --listen tcp://*:PORT", listen, env->nnodes);
  } else {
    if (!has_join)
      return fsdp_set_error(FSDP_ERR_INVALID, "SLURM_NODEID=%d makes this node an agent, which needs --join tcp://%s:PORT "
                            "(the coordinator runs on the allocation's first node, %s)", env->node_id, env->first_host,
                            env->first_host);
    char host[SLURM_HOST_MAX];
    if (!tcp_host(flags->join, host, sizeof host))
      return fsdp_set_error(FSDP_ERR_INVALID, "--join %s: under --slurm an agent joins the first node over TCP: "
                            "--join tcp://%s:PORT", flags->join, env->first_host);
    if (!same_host(host, env->first_host))
      return fsdp_set_error(FSDP_ERR_INVALID, "--join %s contradicts SLURM_JOB_NODELIST=%s: the coordinator runs on its "
                            "first node, %s", flags->join, env->nodelist, env->first_host);
  }
  TRY(resolve_gpus(env, flags->gpus, out->gpus, sizeof out->gpus));
  snprintf(out->name, sizeof out->name, "%s", flags->name && *flags->name ? flags->name : env->node_name);
  return FSDP_OK;
}

static int same_addr(const struct addrinfo *x, const struct addrinfo *y) {
  for (; x; x = x->ai_next)
    for (const struct addrinfo *b = y; b; b = b->ai_next)
      if (x->ai_addrlen == b->ai_addrlen && !memcmp(x->ai_addr, b->ai_addr, x->ai_addrlen)) return 1;
  return 0;
}

int slurm_same_host(const char *a, const char *b) {
  if (!strcasecmp(a, b)) return 1;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ra = NULL, *rb = NULL;
  int same = 0;
  if (getaddrinfo(a, NULL, &hints, &ra) == 0 && getaddrinfo(b, NULL, &hints, &rb) == 0) same = same_addr(ra, rb);
  if (ra) freeaddrinfo(ra);
  if (rb) freeaddrinfo(rb);
  return same;
}
