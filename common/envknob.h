/* envknob — every FSDP_* environment variable that fsdpd, fsdp-worker and fsdpctl read, declared
 * once: envknob.c's table holds each one's name, default and help, one line each (as NCCL declares
 * its NCCL_* parameters), and docs/operations.md's table lists the same rows (ctest env_knobs
 * checks that the two agree and that no source reads an FSDP_* variable around this module).
 * envknob_get reads the environment at each call: a caller that must see one value for the
 * process's life caches it. Any thread (as getenv: no one here sets the environment meanwhile).
 */
#ifndef FSDP_ENVKNOB_H
#define FSDP_ENVKNOB_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
  ENV_CTL, ENV_SERVER_KEY, ENV_CLIENT_KEY, ENV_WORKER, ENV_GNUPLOT,          /* fsdpctl, fsdpd */
  ENV_CPU_DEVICE, ENV_CPU_BF16, ENV_TRACE, ENV_GLOO_IFACE, ENV_GLOO_HOST, ENV_CUDNN_LIB, ENV_CUDA_ATTN,   /* fsdp-worker */
  ENV_SUM_ORDER, ENV_FAULT, ENV_TEST_CKPT_PAUSE, ENV_TEST_CKPT_PAUSE_DIR,   /* tests only */
  ENV_NKNOBS
} envknob_id;

typedef struct envknob {
  const char *name;   /* the variable */
  const char *def;    /* its value when unset or empty; NULL: none */
  const char *help;   /* who reads it and what it does (docs/operations.md says more) */
} envknob;

extern const envknob envknobs[ENV_NKNOBS];

/* The variable's value when it is set and not empty, else its default (NULL where it has none). */
const char *envknob_get(envknob_id id);
/* The variable's name, for messages. */
static inline const char *envknob_name(envknob_id id) { return envknobs[id].name; }

#ifdef __cplusplus
}
#endif

#endif
