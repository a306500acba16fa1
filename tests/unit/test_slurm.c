/* test_slurm — `fsdpd --slurm`: the first host of compact Slurm host lists, reading the allocation's
 * variables (missing, malformed, contradicting each other), and reconciling them with the flags:
 * node 0 is the coordinator, the others agents joining the first node; the GPUs are the
 * allocation's; every contradiction is one error that names the flag and the variable. */
#include <stdio.h>
#include <string.h>

#include "agent.h"
#include "check.h"
#include "slurm.h"

static void check_first(const char *list, const char *want) {
  char host[SLURM_HOST_MAX];
  fsdp_status rc = slurm_first_host(list, host, sizeof host);
  CHECK_OK(rc);
  if (rc == FSDP_OK && strcmp(host, want)) {
    fprintf(stderr, "slurm_first_host(%s): expected %s, got %s\n", list, want, host);
    CHECK(0);
  }
}

static void test_first_host(void) {
  check_first("n1", "n1");
  check_first("n[1-3,5]", "n1");
  check_first("gpu[007-010],cpu1", "gpu007");
  check_first("a,b[2-3]", "a");
  check_first("rack[1-2]-node[04,09]", "rack1-node04");
  check_first("node-[12]", "node-12");
  char host[SLURM_HOST_MAX], small[4];
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_first_host("", host, sizeof host));
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_first_host(",n1", host, sizeof host));
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_first_host("n[1-3", host, sizeof host));
  CHECK(strstr(fsdp_last_error(), "'[' without ']'") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_first_host("n[a-c]", host, sizeof host));
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_first_host("n1]", host, sizeof host));
  CHECK_EQ_INT(FSDP_ERR_RANGE, slurm_first_host("node[1-2]", small, sizeof small));
  CHECK_OK(slurm_first_host("abc,defgh", small, sizeof small));
  CHECK(!strcmp(small, "abc"));
}

/* The variables of a 2-node allocation, node ID, GPU count and CUDA_VISIBLE_DEVICES as given (NULL:
 * not set); EXTRA adds one more. */
static char *envp[16];
static char bufs[16][128];
static char *const *alloc_env(const char *node, const char *gpus_on_node, const char *visible, const char *extra) {
  int n = 0;
  const char *base[] = {"HOME=/root", "SLURM_JOB_ID=42", "SLURM_JOB_NUM_NODES=2", "SLURM_JOB_NODELIST=gpu[07-08]",
                        "SLURM_LOCALID=0"};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) snprintf(bufs[n], sizeof bufs[n], "%s", base[i]), envp[n] = bufs[n], n++;
  if (node) snprintf(bufs[n], sizeof bufs[n], "SLURM_NODEID=%s", node), envp[n] = bufs[n], n++;
  if (node) snprintf(bufs[n], sizeof bufs[n], "SLURMD_NODENAME=gpu%02d", 7 + (node[0] - '0')), envp[n] = bufs[n], n++;
  if (gpus_on_node) snprintf(bufs[n], sizeof bufs[n], "SLURM_GPUS_ON_NODE=%s", gpus_on_node), envp[n] = bufs[n], n++;
  if (visible) snprintf(bufs[n], sizeof bufs[n], "CUDA_VISIBLE_DEVICES=%s", visible), envp[n] = bufs[n], n++;
  if (extra) snprintf(bufs[n], sizeof bufs[n], "%s", extra), envp[n] = bufs[n], n++;
  envp[n] = NULL;
  return envp;
}

static void test_env_read(void) {
  slurm_env e;
  CHECK_OK(slurm_env_read(alloc_env("1", "2", "4,5", NULL), &e));
  CHECK(!strcmp(e.job_id, "42"));
  CHECK_EQ_INT(1, e.node_id);
  CHECK_EQ_INT(2, e.nnodes);
  CHECK(!strcmp(e.first_host, "gpu07") && !strcmp(e.node_name, "gpu08"));
  CHECK_EQ_INT(2, e.gpus);
  CHECK_EQ_INT(1, e.visible_set);
  /* The GPU count from either variable, or unknown. */
  CHECK_OK(slurm_env_read(alloc_env("0", NULL, "0,1,2", NULL), &e));
  CHECK_EQ_INT(3, e.gpus);
  CHECK(!strcmp(e.gpus_from, "CUDA_VISIBLE_DEVICES=0,1,2"));
  CHECK_OK(slurm_env_read(alloc_env("0", "4", NULL, NULL), &e));
  CHECK_EQ_INT(4, e.gpus);
  CHECK_EQ_INT(0, e.visible_set);
  CHECK_OK(slurm_env_read(alloc_env("0", NULL, "NoDevFiles", NULL), &e));
  CHECK_EQ_INT(0, e.gpus);
  CHECK_OK(slurm_env_read(alloc_env("0", NULL, NULL, NULL), &e));
  CHECK_EQ_INT(-1, e.gpus);
  /* Not an allocation, not a step, malformed, contradicting each other. */
  char *none[] = {"HOME=/root", NULL};
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(none, &e));
  CHECK(strstr(fsdp_last_error(), "SLURM_JOB_ID is not set") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(alloc_env(NULL, NULL, NULL, NULL), &e));
  CHECK(strstr(fsdp_last_error(), "SLURM_NODEID is not set") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(alloc_env("x", NULL, NULL, NULL), &e));
  CHECK(strstr(fsdp_last_error(), "SLURM_NODEID='x'") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(alloc_env("2", NULL, NULL, NULL), &e));
  CHECK(strstr(fsdp_last_error(), "SLURM_NODEID=2 is not below SLURM_JOB_NUM_NODES=2") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(alloc_env("0", "-1", NULL, NULL), &e));
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(alloc_env("0", "2", "0", NULL), &e));
  CHECK(strstr(fsdp_last_error(), "CUDA_VISIBLE_DEVICES=0 (1 GPUs) contradicts SLURM_GPUS_ON_NODE=2") != NULL);
  /* Later entries do not override: the first SLURM_LOCALID (0) counts; a second task on a node is refused. */
  char *two_tasks[] = {"SLURM_JOB_ID=42", "SLURM_NODEID=0", "SLURM_LOCALID=1", "SLURM_JOB_NODELIST=a", NULL};
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(two_tasks, &e));
  CHECK(strstr(fsdp_last_error(), "SLURM_LOCALID=1: fsdpd runs once per node") != NULL);
  char *no_list[] = {"SLURM_JOB_ID=42", "SLURM_NODEID=0", NULL};
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(no_list, &e));
  CHECK(strstr(fsdp_last_error(), "SLURM_JOB_NODELIST is not set") != NULL);
  char *bad_list[] = {"SLURM_JOB_ID=42", "SLURM_NODEID=0", "SLURM_JOB_NODELIST=n[1-", NULL};
  CHECK_EQ_INT(FSDP_ERR_INVALID, slurm_env_read(bad_list, &e));
}

static int names_equal(const char *a, const char *b) { return !strcmp(a, b); }

/* resolve with the given node and GPU variables and flags; returns the status, fills *r. */
static fsdp_status resolve(const char *node, const char *gpus_on_node, const char *visible, const char *join,
                           const char *listen, const char *gpus, slurm_role *r) {
  slurm_env e;
  TRY(slurm_env_read(alloc_env(node, gpus_on_node, visible, NULL), &e));
  slurm_flags f = {.join = join, .listen = listen, .gpus = gpus, .name = NULL};
  return slurm_resolve(&e, &f, names_equal, r);
}

static void test_resolve(void) {
  slurm_role r;
  /* Node 0: the coordinator, listening on TCP for the other node; GPUs: the allocation's. */
  CHECK_OK(resolve("0", "2", "0,1", NULL, "tcp://*:7070", NULL, &r));
  CHECK_EQ_INT(1, r.coordinator);
  CHECK(!strcmp(r.gpus, "all"));
  CHECK(!strcmp(r.name, "gpu07"));
  /* Node 1: an agent joining the first node. */
  CHECK_OK(resolve("1", "2", NULL, "tcp://gpu07:7070", NULL, "", &r));
  CHECK_EQ_INT(0, r.coordinator);
  CHECK(!strcmp(r.gpus, "0,1"));   /* no CUDA_VISIBLE_DEVICES: the first N the driver shows */
  CHECK(!strcmp(r.name, "gpu08"));
  CHECK_OK(resolve("1", "2", "3,5", "tcp://gpu07:7070", NULL, "1,0", &r));
  CHECK(!strcmp(r.gpus, "1,0"));
  /* No GPUs in the allocation: none; no GPU variable at all: the flag as without Slurm. */
  CHECK_OK(resolve("1", "0", NULL, "tcp://gpu07:7070", NULL, NULL, &r));
  CHECK(!strcmp(r.gpus, "none"));
  CHECK_OK(resolve("1", NULL, NULL, "tcp://gpu07:7070", NULL, "none", &r));
  CHECK(!strcmp(r.gpus, "none"));
  CHECK_OK(resolve("1", NULL, NULL, "tcp://gpu07:7070", NULL, NULL, &r));
  CHECK(!strcmp(r.gpus, "all"));
  /* --name wins over SLURMD_NODENAME. */
  slurm_env e;
  CHECK_OK(slurm_env_read(alloc_env("1", NULL, NULL, NULL), &e));
  slurm_flags f = {.join = "tcp://gpu07:7070", .name = "second"};
  CHECK_OK(slurm_resolve(&e, &f, names_equal, &r));
  CHECK(!strcmp(r.name, "second"));

  /* Contradictions: one line naming the flag's value and the variable's. */
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("0", NULL, NULL, "tcp://gpu07:7070", NULL, NULL, &r));
  CHECK(strstr(fsdp_last_error(), "--join tcp://gpu07:7070 contradicts SLURM_NODEID=0") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("0", NULL, NULL, NULL, NULL, NULL, &r));
  CHECK(strstr(fsdp_last_error(), "contradicts SLURM_JOB_NUM_NODES=2") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("0", NULL, NULL, NULL, "ipc:///tmp/x.sock", NULL, &r));
  CHECK(strstr(fsdp_last_error(), "--listen ipc:///tmp/x.sock contradicts SLURM_JOB_NUM_NODES=2") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", NULL, NULL, NULL, NULL, NULL, &r));
  CHECK(strstr(fsdp_last_error(), "SLURM_NODEID=1 makes this node an agent, which needs --join tcp://gpu07:PORT") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", NULL, NULL, "tcp://gpu08:7070", NULL, NULL, &r));
  CHECK(strstr(fsdp_last_error(), "--join tcp://gpu08:7070 contradicts SLURM_JOB_NODELIST=gpu[07-08]: the coordinator "
                                  "runs on its first node, gpu07") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", NULL, NULL, "ipc:///tmp/c.sock", NULL, NULL, &r));
  CHECK(strstr(fsdp_last_error(), "joins the first node over TCP") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", "2", NULL, "tcp://gpu07:7070", NULL, "0,1,2,3", &r));
  CHECK(strstr(fsdp_last_error(), "--gpus 0,1,2,3 contradicts SLURM_GPUS_ON_NODE=2") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", "2", NULL, "tcp://gpu07:7070", NULL, "0,2", &r));
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", "2", NULL, "tcp://gpu07:7070", NULL, "1,1", &r));
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", "2", NULL, "tcp://gpu07:7070", NULL, "0,1,", &r));   /* empty entry */
  /* the --gpus syntax itself, as fsdpd checks it before anything starts (with or without Slurm) */
  static const char *const good[] = {"all", "none", "0", "0,1", "7,3,12"};
  static const char *const bad[] = {"", ",", "0,", ",0", "0,,1", "0,1,", "0, 1", "x", "-1", "0;1", "all,0"};
  for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) CHECK_OK(agent_check_gpus(good[i]));
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    CHECK_EQ_INT(FSDP_ERR_INVALID, agent_check_gpus(bad[i]));
    CHECK(strstr(fsdp_last_error(), "expected all, none or a list of device indices like 0,1") != NULL);
  }
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", NULL, "0,1", "tcp://gpu07:7070", NULL, "none", &r));
  CHECK(strstr(fsdp_last_error(), "--gpus none contradicts CUDA_VISIBLE_DEVICES=0,1") != NULL);
  CHECK_EQ_INT(FSDP_ERR_INVALID, resolve("1", "0", NULL, "tcp://gpu07:7070", NULL, "0", &r));
  /* A message for users carries no source location and is one line. */
  const char *msg = fsdp_last_error();
  CHECK(!strncmp(msg, "--gpus 0 contradicts SLURM_GPUS_ON_NODE=0", 41) && !strchr(msg, '\n'));
}

static void test_same_host(void) {
  CHECK_EQ_INT(1, slurm_same_host("Node1", "node1"));
  CHECK_EQ_INT(1, slurm_same_host("localhost", "127.0.0.1"));   /* an address of the name */
  CHECK_EQ_INT(0, slurm_same_host("127.0.0.1", "127.0.0.2"));
  CHECK_EQ_INT(0, slurm_same_host("no-such-host.invalid", "127.0.0.1"));
}

int main(void) {
  test_first_host();
  test_env_read();
  test_resolve();
  test_same_host();
  return check_done();
}
