/* test_schedule — placement's host-memory limit for [fsdp] offload = optimizer (schedule.h):
 * schedule_host_ranks on the numbers, then schedule_fit (the submit check) and schedule_room (what
 * schedule_try starts a job on) over a coordinator whose nodes are filled in by hand: GPU slots and
 * the host memory an agent would report, with no daemon, socket or GPU. The plan of a device = cuda
 * job is built on any machine (only submitting one needs a CUDA build). Also schedule_regroup: hybrid's
 * default shard group taken again at the start, and its plan checked against the devices again.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "coord_core.h"
#include "job_priv.h"   /* jobs built by hand */
#include "schedule.h"

#define GIB (1ull << 30)
#define CUDA FSDP__DEVICE_KIND__DEVICE_KIND_CUDA

static const char *spec_text(const char *offload) {
  static char buf[1024];
  snprintf(buf, sizeof buf,
           "[job]\nname = off\nsteps = 3\n[model]\nn_layer = 48\nn_head = 25\nn_embd = 1600\nvocab_size = 50257\n"
           "seq_len = 1024\n"
           "[data]\ntrain = synthetic:markov:1\nbatch_size = 2\n[fsdp]\nworld_size = 8\ndevice = cuda\noffload = %s\n",
           offload);
  return buf;
}

/* A queued job of WORLD ranks from spec_text(OFFLOAD), with id ID. */
static job_t *make_job(uint64_t id, int world, const char *offload) {
  job_t *j = calloc(1, sizeof *j);
  CHECK_OK(jobspec_parse(spec_text(offload), "test", ".", &j->spec));
  CHECK_OK(plan_build(&j->spec, world, &j->plan));
  j->id = id;
  j->world = world;
  j->kind = CUDA;
  j->state = ST_QUEUED;
  return j;
}

static void free_job(job_t **j) {
  plan_destroy(&(*j)->plan);
  free(*j);
  *j = NULL;
}

/* Node I: NGPU GPUs of 141 GiB (the plan fits any of them), HOST bytes of host memory reported. */
static void set_node(coord_t *c, int i, const char *name, int ngpu, uint64_t host) {
  node_t *n = &c->nodes[i];
  free(n->slots);
  memset(n, 0, sizeof *n);
  n->id = (uint32_t)i + 1;
  snprintf(n->name, sizeof n->name, "%s", name);
  n->slots = calloc((size_t)ngpu, sizeof *n->slots);
  n->nslots = ngpu;
  for (int s = 0; s < ngpu; s++) {
    n->slots[s].kind = CUDA;
    n->slots[s].index = (uint32_t)s;
    n->slots[s].mem = 141 * GIB;
  }
  n->host_mem = host;
}

/* Give job J the first K free slots of node I (as placement would). */
static void occupy(coord_t *c, int i, const job_t *j, int k) {
  for (int s = 0; s < c->nodes[i].nslots && k > 0; s++)
    if (!c->nodes[i].slots[s].job_id) {
      c->nodes[i].slots[s].job_id = j->id;
      k--;
    }
}

static void test_host_ranks(void) {
  CHECK(schedule_host_usable(1000) == 900);
  CHECK(schedule_host_usable(100 * GIB) == 90 * GIB);
  CHECK(schedule_host_usable(0) == 0);
  uint64_t hb = 3 * GIB;
  CHECK_EQ_INT(INT_MAX, schedule_host_ranks(0, 0, hb));          /* the node reported nothing: no limit */
  CHECK_EQ_INT(INT_MAX, schedule_host_ranks(64 * GIB, 0, 0));    /* no offload: no limit */
  CHECK_EQ_INT(3, schedule_host_ranks(12 * GIB, 0, hb));         /* 10.8 GiB usable */
  CHECK_EQ_INT(4, schedule_host_ranks(14 * GIB, 0, hb));         /* 12.6 GiB usable */
  CHECK_EQ_INT(4, schedule_host_ranks(40 * GIB / 3, 0, hb));     /* 13.3 GiB less the reserve: 4 ranks to a few bytes */
  CHECK_EQ_INT(3, schedule_host_ranks(40 * GIB / 3 - 10, 0, hb));
  CHECK_EQ_INT(1, schedule_host_ranks(12 * GIB, 2 * hb, hb));    /* two already pinned there */
  CHECK_EQ_INT(0, schedule_host_ranks(12 * GIB, 3 * hb, hb));
  CHECK_EQ_INT(0, schedule_host_ranks(12 * GIB, 20 * GIB, hb));  /* more pinned than usable */
  /* the brief's example: 8 ranks of 36.2/8 GiB against 31.0 GiB reported hold 6 */
  CHECK_EQ_INT(6, schedule_host_ranks(31 * GIB, 0, (uint64_t)(36.2 / 8 * GIB)));
}

static void test_fit_and_room(void) {
  coord_t *c = calloc(1, sizeof *c);
  c->nodes = calloc(3, sizeof *c->nodes);
  c->nnodes = 2;
  job_t *j8 = make_job(10, 8, "optimizer");
  uint64_t hb = j8->plan->host_bytes;
  CHECK(hb > 0 && hb == 16 * (uint64_t)j8->plan->shard_total);

  /* two nodes of 4 GPUs whose host memory holds 3 offload ranks each: 6 < 8 is refused at submit */
  set_node(c, 0, "gpu-1", 4, 4 * hb);
  set_node(c, 1, "gpu-2", 4, 4 * hb);
  char msg[1024];
  CHECK(schedule_fit(c, j8, msg, sizeof msg) == FSDP_ERR_RANGE);
  char want[256];
  snprintf(want, sizeof want, "needs %.1f GiB of host memory per node for 4 ranks", 4.0 * (double)hb / GIB);
  CHECK(strstr(msg, "offload = optimizer") && strstr(msg, want));
  CHECK(strstr(msg, "node gpu-1 reports") && strstr(msg, "for 3 ranks"));
  CHECK(strstr(msg, "holds 6 of the job's 8 ranks"));
  CHECK(strstr(msg, "allowed: fewer ranks per node, more nodes, or offload = none"));
  CHECK(strchr(msg, '\n') == NULL);
  printf("refusal: %s\n", msg);
  /* the same job without offload fits; so does one of 6 offload ranks */
  job_t *plain = make_job(11, 8, "none");
  CHECK(plain->plan->host_bytes == 0);
  CHECK_OK(schedule_fit(c, plain, msg, sizeof msg));
  CHECK_EQ_INT(8, schedule_room(c, plain));
  job_t *j6 = make_job(12, 6, "optimizer");
  uint64_t hb6 = j6->plan->host_bytes;   /* a larger shard at 6 ranks: size the nodes by it */
  set_node(c, 0, "gpu-1", 4, 4 * hb6);
  set_node(c, 1, "gpu-2", 4, 4 * hb6);
  CHECK_OK(schedule_fit(c, j6, msg, sizeof msg));
  CHECK_EQ_INT(6, schedule_room(c, j6));

  /* a node that reported no host memory (an agent that does not measure it) is not limited */
  set_node(c, 0, "gpu-1", 4, 4 * hb);
  set_node(c, 1, "gpu-2", 5, 0);
  CHECK_OK(schedule_fit(c, j8, msg, sizeof msg));
  CHECK_EQ_INT(8, schedule_room(c, j8));   /* 3 + 5 */
  set_node(c, 1, "gpu-2", 4, 0);           /* 3 + 4 < 8: refused, naming the node short of memory */
  CHECK(schedule_fit(c, j8, msg, sizeof msg) == FSDP_ERR_RANGE);
  CHECK(strstr(msg, "node gpu-1 reports") && strstr(msg, "holds 7 of the job's 8"));

  /* the node named is the one placement fills first (the most GPUs) among those short of memory */
  c->nnodes = 3;
  set_node(c, 0, "gpu-1", 2, 2 * hb);      /* holds 1 of 2 */
  set_node(c, 1, "gpu-2", 4, 2 * hb);      /* holds 1 of 4 */
  set_node(c, 2, "gpu-3", 2, 0);
  CHECK(schedule_fit(c, j8, msg, sizeof msg) == FSDP_ERR_RANGE);
  CHECK(strstr(msg, "for 4 ranks") && strstr(msg, "node gpu-2 reports") && strstr(msg, "holds 4 of the job's 8"));
  /* a lost node counts for nothing */
  set_node(c, 0, "gpu-1", 4, 100 * hb);
  set_node(c, 1, "gpu-2", 4, 100 * hb);
  CHECK_OK(schedule_fit(c, j8, msg, sizeof msg));
  c->nodes[1].lost = 1;
  CHECK(schedule_fit(c, j8, msg, sizeof msg) == FSDP_ERR_RANGE);   /* too few GPUs: the older message */
  CHECK(strstr(msg, "needs 8 GPUs but the cluster has 6"));
  c->nnodes = 2;

  /* room now: offload ranks already placed pin their node's memory; other jobs' do not */
  job_t *q = make_job(3, 2, "optimizer");
  uint64_t hq = q->plan->host_bytes;
  job_t *a = make_job(1, 4, "optimizer");
  a->plan->host_bytes = hq;                /* the same bytes per rank as q's, to count in whole ranks */
  job_t *b = make_job(2, 4, "none");
  a->next = b;
  c->jobs = a;
  set_node(c, 0, "gpu-1", 4, 4 * hq);      /* usable 3.6·hq: 3 offload ranks */
  set_node(c, 1, "gpu-2", 4, 4 * hq);
  CHECK_EQ_INT(6, schedule_room(c, q));
  occupy(c, 0, a, 1);                      /* a's rank pins hq on gpu-1: 2 more there */
  CHECK_EQ_INT(5, schedule_room(c, q));
  occupy(c, 1, b, 3);                      /* b pins nothing: gpu-2's one free GPU takes one */
  CHECK_EQ_INT(3, schedule_room(c, q));
  occupy(c, 0, a, 2);                      /* 3 of a's ranks on gpu-1: none of q there, though a GPU is free */
  CHECK_EQ_INT(1, schedule_room(c, q));    /* q waits: 1 < 2 */
  CHECK_EQ_INT(2, schedule_room(c, plain));   /* without offload, every free GPU */
  CHECK_OK(schedule_fit(c, q, msg, sizeof msg));   /* it fits the cluster, so it is queued, not refused */
  c->nodes[0].lost = 1;                    /* a lost node's GPUs are no room */
  CHECK_EQ_INT(1, schedule_room(c, q));
  c->nodes[1].lost = 1;
  CHECK_EQ_INT(0, schedule_room(c, q));

  c->jobs = NULL;
  free_job(&a), free_job(&b), free_job(&q), free_job(&j8), free_job(&j6), free_job(&plain);
  for (int i = 0; i < 3; i++) free(c->nodes[i].slots);
  free(c->nodes);
  free(c);
}

/* Hybrid without shard_group takes G from the cluster it starts on; a smaller G holds more per rank,
 * so the plan is checked again: GPT-2 1.5B at world 16 fits GPUs of M bytes with G = 8 (2 nodes of
 * 8) but not with G = 2 (8 nodes of 2), and then the job is refused with the reason, unchanged. */
static void test_regroup(void) {
  jobspec_t s;
  CHECK_OK(jobspec_parse(spec_text("none"), "test", ".", &s));
  s.world_size = 16;
  s.sharding = SHARD_HYBRID;
  plan_t *p8 = NULL, *p2 = NULL;
  s.shard_group = 8;
  CHECK_OK(plan_build(&s, 16, &p8));
  s.shard_group = 2;
  CHECK_OK(plan_build(&s, 16, &p2));
  if (!p8 || !p2) return;
  CHECK(p2->mem_total > p8->mem_total);
  uint64_t m = (p8->mem_total + p2->mem_total) / 2;
  job_t *j = calloc(1, sizeof *j);
  s.shard_group = 8;
  j->spec = s, j->plan = p8, j->id = 7, j->world = 16, j->kind = CUDA, j->state = ST_QUEUED, j->auto_group = 1;
  char dir[] = "/tmp/test_schedule.XXXXXX";
  CHECK(mkdtemp(dir) != NULL);
  snprintf(j->job_dir, sizeof j->job_dir, "%s", dir);
  coord_t *c = calloc(1, sizeof *c);
  c->nodes = calloc(8, sizeof *c->nodes);
  c->nnodes = 2;
  for (int i = 0; i < 8; i++) {
    char name[16];
    snprintf(name, sizeof name, "gpu-%d", i);
    set_node(c, i, name, i < 2 ? 8 : 2, 0);
    for (int g = 0; g < c->nodes[i].nslots; g++) c->nodes[i].slots[g].mem = m;
  }
  char msg[1024];
  CHECK_OK(schedule_regroup(c, j, msg, sizeof msg));   /* 2 nodes of 8: G stays 8 */
  CHECK(j->plan == p8 && j->spec.shard_group == 8);
  for (int i = 0; i < 8; i++) {   /* now 8 nodes of 2 GPUs: G = 2 would not fit */
    char name[16];
    snprintf(name, sizeof name, "gpu-%d", i);
    set_node(c, i, name, 2, 0);
    c->nodes[i].slots[0].mem = c->nodes[i].slots[1].mem = m;
  }
  c->nnodes = 8;
  CHECK(schedule_regroup(c, j, msg, sizeof msg) == FSDP_ERR_RANGE);
  CHECK(strstr(msg, "ranks per node of the cluster (2 GPUs on the largest node now)") != NULL);
  CHECK(strstr(msg, "GiB per rank at world size 16") != NULL);
  CHECK(strchr(msg, '\n') == NULL);
  CHECK(j->plan == p8 && j->spec.shard_group == 8);   /* unchanged */
  printf("regroup refusal: %s\n", msg);
  for (int i = 0; i < 8; i++) c->nodes[i].slots[0].mem = c->nodes[i].slots[1].mem = 2 * p2->mem_total;
  CHECK_OK(schedule_regroup(c, j, msg, sizeof msg));   /* larger GPUs: G = 2 is taken */
  CHECK(j->spec.shard_group == 2 && j->plan->shard_world == 2);
  char path[64];
  snprintf(path, sizeof path, "%s/job.log", dir);
  FILE *f = fopen(path, "r");
  char line[512] = "";
  CHECK(f && fgets(line, sizeof line, f) && strstr(line, "shard_group = 2: the ranks per node"));
  if (f) fclose(f);
  unlink(path);
  rmdir(dir);
  plan_destroy(&p2);
  free_job(&j);
  for (int i = 0; i < 8; i++) free(c->nodes[i].slots);
  free(c->nodes);
  free(c);
}

int main(void) {
  test_host_ranks();
  test_fit_and_room();
  test_regroup();
  return check_done();
}
