/* schedule — see schedule.h. */
#define _GNU_SOURCE
#include "schedule.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "job.h"
#include "jobresolve.h"
#include "log.h"
#include "planmsg.h"

static int node_free_slots(const node_t *n, int kind) {
  if (n->lost) return 0;
  int f = 0;
  for (int s = 0; s < n->nslots; s++) f += n->slots[s].kind == kind && n->slots[s].job_id == 0;
  return f;
}

static int live_devices(const coord_t *c, int kind, int *live_nodes, uint64_t *min_mem);

uint64_t schedule_host_usable(uint64_t host_mem) { return host_mem - host_mem / 100 * SCHEDULE_HOST_RESERVE_PCT; }

int schedule_host_ranks(uint64_t host_mem, uint64_t used, uint64_t host_bytes) {
  if (!host_bytes || !host_mem) return INT_MAX;
  uint64_t usable = schedule_host_usable(host_mem);
  if (used >= usable) return 0;
  uint64_t k = (usable - used) / host_bytes;
  return k > INT_MAX ? INT_MAX : (int)k;
}

static uint64_t job_host_bytes(const job_t *j) { return job_plan(j) ? job_plan(j)->host_bytes : 0; }

/* Host memory pinned on N by the offload ranks placed there, those of ending jobs included: theirs
 * is freed only when their workers exit, which is also when their slots are. */
static uint64_t node_host_used(const coord_t *c, const node_t *n) {
  uint64_t used = 0;
  for (int s = 0; s < n->nslots; s++) {
    if (!n->slots[s].job_id) continue;
    for (const job_t *j = c->jobs; j; j = job_next(j))
      if (job_id(j) == n->slots[s].job_id) {
        used += job_host_bytes(j);
        break;
      }
  }
  return used;
}

/* The ranks of J that N can take now: its free devices of J's kind, for an offload job at most as
 * many as its host memory still holds. */
static int node_room(const coord_t *c, const node_t *n, const job_t *j) {
  int f = node_free_slots(n, job_kind(j));
  uint64_t hb = job_host_bytes(j);
  if (!f || !hb || !n->host_mem) return f;
  int h = schedule_host_ranks(n->host_mem, node_host_used(c, n), hb);
  return h < f ? h : f;
}

int schedule_room(const coord_t *c, const job_t *j) {
  int room = 0;
  for (int i = 0; i < c->nnodes; i++) room += node_room(c, &c->nodes[i], j);
  return room;
}

/* The ranks of J that N could take with nothing else on it (0 for a lost node). */
static int node_capacity(const node_t *n, const job_t *j) {
  if (n->lost) return 0;
  int d = 0;
  for (int s = 0; s < n->nslots; s++) d += n->slots[s].kind == job_kind(j);
  int h = schedule_host_ranks(n->host_mem, 0, job_host_bytes(j));
  return h < d ? h : d;
}

/* The ranks of J that the live cluster could hold with nothing else running. */
static int live_capacity(const coord_t *c, const job_t *j) {
  int total = 0;
  for (int i = 0; i < c->nnodes; i++) total += node_capacity(&c->nodes[i], j);
  return total;
}

static void send_spawn(coord_t *c, job_t *j, int r, int local_ranks) {
  node_t *n = &c->nodes[job_rank(j, r)->node];
  char job[32], rank[32], local[64], jobenv[64], token[64];
  snprintf(job, sizeof job, "%llu", (unsigned long long)job_id(j));
  snprintf(rank, sizeof rank, "%d", r);
  snprintf(local, sizeof local, "FSDPD_LOCAL_RANKS=%d", local_ranks);
  snprintf(jobenv, sizeof jobenv, "FSDPD_JOB_ID=%llu", (unsigned long long)job_id(j));
  /* The token in the environment, which only the worker's owner (and root) can read; a command
   * line is every user's to read. */
  snprintf(token, sizeof token, "%s=%s", WIRE_WORKER_TOKEN_ENV, job_token(j));
  char *argv[] = {"fsdp-worker", "--connect", c->listen_ep, "--job", job, "--rank", rank,
                  "--log-level", (char *)(c->cfg.worker_log_level ? c->cfg.worker_log_level : "info")};
  char *env[] = {local, jobenv, token};
  Fsdp__SpawnReq s = FSDP__SPAWN_REQ__INIT;
  s.job_id = job_id(j);
  s.rank = (uint32_t)r;
  s.n_argv = sizeof argv / sizeof argv[0];
  s.argv = argv;
  s.n_env = sizeof env / sizeof env[0];
  s.env = env;
  const peer_t *owner = job_owner(j);
  s.cwd = (char *)job_dir_of(j);
  s.user = (char *)owner->name;
  s.uid = (uint32_t)owner->uid;
  s.gid = (uint32_t)owner->gid;
  s.umask = job_umask(j);
  Fsdp__Msg m = WIRE_MSG_INIT;
  m.body_case = FSDP__MSG__BODY_SPAWN_REQ;
  m.spawn_req = &s;
  coord_send(c, n->ident, n->ident_len, &m);
  job_rank_spawned(j, r);
}

/* Assign free slots to ranks R.. in node ORDER, CHUNK ranks at a time per node (whole shard groups
 * of a hybrid job; 1: every free slot); the next unplaced rank. */
static int place_ranks(coord_t *c, job_t *j, const int *order, int *cnt, int r, int chunk) {
  int world = job_world(j), kind = job_kind(j);
  for (int oi = 0; oi < c->nnodes && r < world; oi++) {
    node_t *n = &c->nodes[order[oi]];
    if (n->lost) continue;
    int take = node_room(c, n, j);   /* offload: J's ranks the hybrid pass put on N already pin its memory */
    take -= take % chunk;
    for (int s = 0; s < n->nslots && r < world && take > 0; s++) {
      slot_t *sl = &n->slots[s];
      if (sl->kind != kind || sl->job_id) continue;
      sl->job_id = job_id(j);
      sl->rank = (uint32_t)r;
      job_rank_place(j, r, order[oi], s);
      cnt[order[oi]]++;
      r++;
      take--;
    }
  }
  return r;
}

/* Hybrid: say which shard groups the placement had to split across nodes (their gathers and
 * reduce-scatters then cross the network), in the job's log and the daemon's. */
static void report_split_groups(job_t *j) {
  int G = job_plan(j)->shard_world, split = 0;
  const rank_st *ranks = job_rank(j, 0);
  char which[512];
  int wn = 0;
  for (int g = 0; g < job_world(j) / G; g++) {
    int node = ranks[g * G].node, one = 1;
    for (int k = 1; k < G; k++) one &= ranks[g * G + k].node == node;
    if (one) continue;
    split++;
    if (wn < (int)sizeof which - 16) wn += snprintf(which + wn, sizeof which - (size_t)wn, "%s%d", wn ? ", " : "", g);
  }
  if (!split) return;
  job_log(j, "placement: %d of %d shard groups (%s) span nodes: the free %s per node do not hold whole groups of %d; "
          "their all-gathers and reduce-scatters cross nodes", split, job_world(j) / G, which, coord_kind_name(job_kind(j)), G);
  log_warn("job %llu: %d hybrid shard group(s) split across nodes (%s)", (unsigned long long)job_id(j), split, which);
}

/* Hybrid without shard_group: G is the ranks per node of the cluster the job starts on (it may
 * differ from the one at submit, or at a restart); a new G rebuilds the plan. 0, or -1 when the job
 * failed (it cannot be planned with that G). */
fsdp_status schedule_regroup(const coord_t *c, job_t *j, char *msg, size_t n) {
  int g = coord_ranks_per_node(c, job_kind(j), job_world(j));
  if (g == job_spec(j)->shard_group) return FSDP_OK;
  jobspec_t s = *job_spec(j);
  s.shard_group = 0;   /* resolved again for this placement */
  jobresolve_place pl = {.world = job_world(j), .ranks_per_node = g};
  plan_t *p = NULL;
  int k = snprintf(msg, n, "sharding = hybrid without shard_group takes the ranks per node of the cluster (%d %s on "
                   "the largest node now): ", g, coord_kind_name(job_kind(j)));
  size_t used = k < 0 ? 0 : (size_t)k < n ? (size_t)k : n - 1;
  fsdp_status st = jobresolve_place_job(&s, &pl, &p);
  if (st != FSDP_OK) {
    snprintf(msg + used, n - used, "%s", fsdp_last_error());
    return st;
  }
  /* the memory per rank grows as the group shrinks: the submit check again, with the new plan */
  job_swap_plan(j, &p, &g);   /* p, g: the old plan and group now */
  if ((st = schedule_fit(c, j, msg + used, n - used)) != FSDP_OK) {
    job_swap_plan(j, &p, &g);
    plan_destroy(&p);
    return st;
  }
  plan_destroy(&p);
  g = job_spec(j)->shard_group;
  job_log(j, "shard_group = %d: the ranks per node of the cluster it starts on", g);
  return FSDP_OK;
}

/* J fails to start: REASON. */
static void start_failed(coord_t *c, job_t *j, const char *reason) {
  job_event(c, j, JE_FAIL, &(job_ev_args){.rank = -1, .node = -1, .msg = reason});
}

/* 0: J started (or failed trying); -1: the room counted for it was not there, it stays queued. */
static int schedule_start(coord_t *c, job_t *j) {
  JOB_ASSERT(job_phase_of(j) == JOB_QUEUED && !job_rank(j, 0));
  /* Pack ranks by node: the nodes with room for the most ranks first (free devices of the kind, for
   * offload also the host memory), filled in order. */
  int *order = calloc((size_t)c->nnodes, sizeof *order), *cnt = calloc((size_t)c->nnodes, sizeof *cnt);
  int *room = calloc((size_t)c->nnodes, sizeof *room);
  if (!order || !cnt || !room || job_place_begin(j) != FSDP_OK) {
    free(order), free(cnt), free(room);
    start_failed(c, j, "out of memory while starting the job");
    return 0;
  }
  for (int i = 0; i < c->nnodes; i++) order[i] = i, room[i] = node_room(c, &c->nodes[i], j);
  for (int i = 1; i < c->nnodes; i++)   /* insertion sort by room, descending; stable */
    for (int k = i; k > 0 && room[order[k]] > room[order[k - 1]]; k--) {
      int t = order[k];
      order[k] = order[k - 1];
      order[k - 1] = t;
    }
  /* hybrid: whole shard groups on a node first, so that a group stays on one node whenever it can;
   * hybrid without shard_group: G was set to the ranks per node before the start (schedule_try) */
  const plan_t *plan = job_plan(j);
  int world = job_world(j), hybrid = plan->sharding == SHARD_HYBRID;
  int r = place_ranks(c, j, order, cnt, 0, hybrid ? plan->shard_world : 1);
  if (r < world) r = place_ranks(c, j, order, cnt, r, 1);
  free(order), free(room);
  if (r < world) {   /* schedule_try counted the same room: not expected; undo, keep the job queued */
    log_error("job %llu: placement found room for %d of %d ranks; it stays queued", (unsigned long long)job_id(j), r,
              world);
    for (int i = 0; i < c->nnodes; i++)
      for (int s = 0; s < c->nodes[i].nslots; s++)
        if (c->nodes[i].slots[s].job_id == job_id(j)) c->nodes[i].slots[s].job_id = 0;
    free(cnt);
    job_place_undo(j);
    return -1;
  }
  if (job_attempt_prepare(j) != FSDP_OK) {
    free(cnt);
    start_failed(c, j, fsdp_last_error());
    return 0;
  }
  job_event(c, j, JE_START, NULL);
  job_open_metrics(j);
  char where[1024];
  int wn = 0;
  for (int i = 0; i < c->nnodes; i++)
    if (cnt[i] && wn < (int)sizeof where - 64) wn += snprintf(where + wn, sizeof where - (size_t)wn, "%s%s×%d", wn ? ", " : "", c->nodes[i].name, cnt[i]);
  job_log(j, "ranks on %s", wn ? where : "-");
  if (hybrid) report_split_groups(j);
  for (int k = 0; k < world; k++) send_spawn(c, j, k, cnt[job_rank(j, k)->node]);
  free(cnt);
  return 0;
}


/* Devices of KIND on the nodes that are not lost: their count, the nodes, the smallest memory. */
static int live_devices(const coord_t *c, int kind, int *live_nodes, uint64_t *min_mem) {
  int total = 0;
  *live_nodes = 0;
  *min_mem = 0;
  for (int i = 0; i < c->nnodes; i++) {
    if (c->nodes[i].lost) continue;
    (*live_nodes)++;
    for (int s = 0; s < c->nodes[i].nslots; s++) {
      const slot_t *sl = &c->nodes[i].slots[s];
      if (sl->kind != kind) continue;
      total++;
      if (sl->mem && (!*min_mem || sl->mem < *min_mem)) *min_mem = sl->mem;
    }
  }
  return total;
}


fsdp_status schedule_fit(const coord_t *c, const job_t *j, char *msg, size_t n) {
  const char *kname = coord_kind_name(job_kind(j));
  const plan_t *plan = job_plan(j);
  int world = job_world(j);
  int live_nodes;
  uint64_t min_mem;
  int total = live_devices(c, job_kind(j), &live_nodes, &min_mem);
  if (world > total) {
    snprintf(msg, n, "the job needs %d %s but the cluster has %d (on %d node%s)", world, kname, total, live_nodes,
             live_nodes == 1 ? "" : "s");
    return FSDP_ERR_RANGE;
  }
  if (min_mem && plan->mem_total > min_mem) {
    int mw = plan_min_world(job_spec(j), min_mem, total);
    int k = snprintf(msg, n, "the job needs %.2f GiB per rank at world size %d, device has %.2f GiB; ",
                     (double)plan->mem_total / (1u << 30), world, (double)min_mem / (1u << 30));
    if (k < 0 || (size_t)k >= n) return FSDP_ERR_RANGE;
    if (mw > 0) snprintf(msg + k, n - (size_t)k, "the smallest world size that fits is %d", mw);
    else snprintf(msg + k, n - (size_t)k, "no world size up to %d (the %s in the cluster) fits", total, kname);
    return FSDP_ERR_RANGE;
  }
  int room = live_capacity(c, j);
  if (room < world) {
    /* Name the node placement fills first (the most devices) among those whose memory holds fewer
     * ranks than placement would put there. One exists: every node holding min(devices, world)
     * would make room ≥ world, the devices being enough. */
    const node_t *short_n = NULL;
    int short_d = 0;
    for (int i = 0; i < c->nnodes; i++) {
      const node_t *nd = &c->nodes[i];
      if (nd->lost) continue;
      int d = 0;
      for (int s = 0; s < nd->nslots; s++) d += nd->slots[s].kind == job_kind(j);
      int want = d < world ? d : world;
      if (node_capacity(nd, j) < want && d > short_d) short_n = nd, short_d = d;
    }
    uint64_t hb = plan->host_bytes, snap = plan->snapshot_bytes;
    int ranks = short_d < world ? short_d : world;
    const double gib = (double)(1u << 30);
    /* what the host memory is for: offload's state, async checkpoints' snapshot, or both */
    const char *what = !snap ? "offload = optimizer" : hb > snap ? "offload = optimizer with [checkpoint] async = true"
                                                                 : "[checkpoint] async = true (its snapshot)";
    const char *off = !snap ? "offload = none" : hb > snap ? "offload = none or async = false" : "async = false";
    if (!short_n) {
      snprintf(msg, n, "%s needs %.2f GiB of host memory per rank; the nodes' host memory holds %d of the job's %d "
               "ranks; allowed: fewer ranks per node, more nodes, or %s", what, (double)hb / gib, room, world, off);
      return FSDP_ERR_RANGE;
    }
    snprintf(msg, n, "%s needs %.1f GiB of host memory per node for %d ranks (%.2f GiB each); "
             "node %s reports %.1f GiB available (%.1f GiB after fsdpd's %d %% reserve, for %d rank%s); the cluster's "
             "host memory holds %d of the job's %d ranks; allowed: fewer ranks per node, more nodes, or %s", what,
             (double)hb * ranks / gib, ranks, (double)hb / gib, short_n->name, (double)short_n->host_mem / gib,
             (double)schedule_host_usable(short_n->host_mem) / gib, SCHEDULE_HOST_RESERVE_PCT, node_capacity(short_n, j),
             node_capacity(short_n, j) == 1 ? "" : "s", room, world, off);
    return FSDP_ERR_RANGE;
  }
  return FSDP_OK;
}
/* Whether J could start on the live cluster once devices are free (its memory fit was checked at
 * submit). A job that cannot (a node it needs was lost) waits aside, so that it never holds the
 * queue, and fails after [job] restart_wait_s. Returns 1 when J may be the head of the queue.
 * An offload job counts a node's devices only as far as its host memory holds their ranks. */
static int fits_live(coord_t *c, job_t *j, double now) {
  int live_nodes;
  uint64_t min_mem;
  int total = live_devices(c, job_kind(j), &live_nodes, &min_mem);
  const char *held = "";
  if (job_host_bytes(j) && live_capacity(c, j) < total) {
    total = live_capacity(c, j);
    held = " whose nodes' host memory holds an offload rank";
  }
  if (total >= job_world(j)) {
    if (job_unfit_since(j)) job_log(j, "the cluster can run the job again (%d %s)", total, coord_kind_name(job_kind(j)));
    job_set_unfit_since(j, 0);
    return 1;
  }
  if (!job_unfit_since(j)) {
    job_set_unfit_since(j, now);
    job_log(j, "waiting aside: the job needs %d %s but the live cluster has %d%s; jobs behind it that fit start "
            "meanwhile; it fails if none return within [job] restart_wait_s = %g s",
            job_world(j), coord_kind_name(job_kind(j)), total, held, job_spec(j)->restart_wait_s);
  } else if (now - job_unfit_since(j) > job_spec(j)->restart_wait_s) {
    char why[2048];
    snprintf(why, sizeof why, "the job needs %d %s but the live cluster has %d%s (on %d node%s), and none returned within "
             "[job] restart_wait_s = %g s%s%s", job_world(j), coord_kind_name(job_kind(j)), total, held, live_nodes,
             live_nodes == 1 ? "" : "s", job_spec(j)->restart_wait_s, job_reason(j)[0] ? "; it was queued again after: " : "",
             job_reason(j));
    job_event(c, j, JE_UNFIT, &(job_ev_args){.rank = -1, .node = -1, .msg = why});
  }
  return 0;
}

void schedule_try(coord_t *c) {
  if (c->shutting_down) return;
  double now = loop_now_mono();
  /* FIFO: the oldest queued job that the live cluster can run starts first; later jobs wait
   * behind it. Only a job that cannot run at all (fits_live) is passed over. */
  for (;;) {
    job_t *head = NULL;
    for (job_t *j = c->jobs; j; j = job_next(j))
      if (job_phase_of(j) == JOB_QUEUED && fits_live(c, j, now) && (!head || job_id(j) < job_id(head)))
        head = j;
    if (!head) return;
    /* before counting room: the shard group, hence the offloaded bytes per rank, may change */
    char why[1024];
    if (job_auto_group(head) && schedule_regroup(c, head, why, sizeof why) != FSDP_OK) {
      start_failed(c, head, why);
      continue;
    }
    if (schedule_room(c, head) < job_world(head)) return;
    if (schedule_start(c, head) != 0) return;
  }
}
