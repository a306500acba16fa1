/* slurm — `fsdpd --slurm`: this node's role, GPUs and name from the Slurm allocation it runs in.
 *
 * Started once per node by srun (scripts/slurm/fsdpd.sbatch), fsdpd takes from the allocation what
 * flags say otherwise: node 0 (SLURM_NODEID) runs the coordinator and its agent, every other node
 * an agent that joins the first node of SLURM_JOB_NODELIST; the GPUs are the ones the allocation
 * gives this node (SLURM_GPUS_ON_NODE, CUDA_VISIBLE_DEVICES); the node's name is SLURMD_NODENAME.
 * A flag given as well must agree with the allocation; one that contradicts it is an error that
 * names both values. The recipe passes the endpoints (the first node's name from `scontrol show
 * hostnames`); this module cross-checks them.
 *
 * Plain functions over an environ-style array and the parsed flags, no state; any thread.
 * slurm_same_host resolves names (getaddrinfo); everything else is pure.
 */
#ifndef FSDP_DAEMON_SLURM_H
#define FSDP_DAEMON_SLURM_H

#include <stddef.h>

#include "err.h"

#define SLURM_HOST_MAX 256

typedef struct slurm_env {
  char job_id[32];                   /* SLURM_JOB_ID */
  int node_id;                       /* SLURM_NODEID: this node's index in the allocation */
  int nnodes;                        /* SLURM_JOB_NUM_NODES (or SLURM_NNODES); -1 when neither is set */
  char nodelist[1024];               /* SLURM_JOB_NODELIST, compact as Slurm writes it: n[1-3,5] */
  char first_host[SLURM_HOST_MAX];   /* its first host: where the coordinator runs */
  char node_name[SLURM_HOST_MAX];    /* SLURMD_NODENAME; "" when not set */
  int gpus;                          /* the allocation's GPUs on this node; -1: no variable says */
  int visible_set;                   /* CUDA_VISIBLE_DEVICES is set (the driver shows exactly those) */
  char gpus_from[128];               /* the variable that said it, for messages: "SLURM_GPUS_ON_NODE=2" */
} slurm_env;

/* What the command line said; NULL or "" when a flag was not given. */
typedef struct slurm_flags {
  const char *join;
  const char *listen;
  const char *gpus;
  const char *name;
} slurm_flags;

/* What this node runs, the allocation and the flags reconciled. */
typedef struct slurm_role {
  int coordinator;                   /* 1 on node 0: the coordinator and its agent; 0: an agent */
  char gpus[256];                    /* --gpus to use: all, none or a list like 0,1 */
  char name[SLURM_HOST_MAX];         /* the node's name; "" = the host name */
} slurm_role;

/* The first host of a compact Slurm host list: "n[03-05,7],m1" -> "n03", "r[1-2]-g[4-5]" -> "r1-g4". */
fsdp_status slurm_first_host(const char *nodelist, char *out, size_t n);
/* The allocation's facts from ENVP (NAME=VALUE strings, NULL-terminated, like environ). A missing
 * or malformed variable is an error that says which and how fsdpd should be started. */
fsdp_status slurm_env_read(char *const *envp, slurm_env *out);
/* This node's role from ENV and FLAGS, or an error naming the flag and the variable it
 * contradicts. SAME_HOST(a, b) says whether two host names or addresses are one machine
 * (slurm_same_host; a test passes a plain comparison). */
fsdp_status slurm_resolve(const slurm_env *env, const slurm_flags *flags, int (*same_host)(const char *, const char *),
                          slurm_role *out);
/* 1 when A and B are the same name (case-insensitive) or resolve to a common address. */
int slurm_same_host(const char *a, const char *b);

#endif
