/* ctl — the fsdpctl subcommands. Each ctl_*.c file implements one family and exports its
 * entry points here; fsdpctl.c dispatches by name. Every command returns the process exit
 * status (0 on success) and prints a one-line reason on stderr otherwise. */
#ifndef FSDP_CTL_H
#define FSDP_CTL_H

typedef int (*ctl_cmd_fn)(int argc, char **argv);   /* argv[0] is the subcommand name */

/* ctl_plan.c: `fsdpctl plan JOB.ini [--world N] [--device-memory BYTES] [--json]` (no daemon). */
int ctl_plan(int argc, char **argv);

/* ctl_data.c: `fsdpctl gen-data --text FILE... -o OUT [--val V --val-fraction F]` or `--markov SEED
 * [--vocab V] --tokens N -o FILE` (no daemon). */
int ctl_gen_data(int argc, char **argv);
int ctl_export(int argc, char **argv);   /* export CKPT_DIR -o OUT.safetensors [--step S] */
/* ctl_sample.c: `fsdpctl sample MODEL --prompt TEXT [...]` runs fsdp-worker --sample (no daemon). */
int ctl_sample(int argc, char **argv);

/* ctl_jobs.c: the commands that talk to fsdpd (--ctl ENDPOINT or $FSDP_CTL picks it; --json on
 * every read command); ctl_run.c: `run` starts a private fsdpd for one job. */
int ctl_submit(int argc, char **argv);   /* submit JOB.ini [--follow] */
int ctl_status(int argc, char **argv);   /* status ID [--json] */
int ctl_jobs(int argc, char **argv);     /* jobs [--limit N] [--json] */
int ctl_logs(int argc, char **argv);     /* logs ID [--rank R] [--follow] */
int ctl_cancel(int argc, char **argv);   /* cancel ID */
int ctl_stop(int argc, char **argv);     /* stop ID: checkpoint first when the job makes them */
int ctl_shutdown(int argc, char **argv); /* shutdown: the daemon stops as on SIGTERM */
int ctl_nodes(int argc, char **argv);    /* nodes [--json] */
int ctl_run(int argc, char **argv);      /* run JOB.ini [--state-dir DIR] [--keep] */

/* ctl_plot.c: `fsdpctl plot ID|METRICS.jsonl -o OUT.png` draws loss, lr and tokens/s through
 * gnuplot (a job id needs the daemon, a path does not). */
int ctl_plot(int argc, char **argv);

/* ctl_trace.c: `fsdpctl trace ID [--steps A..B] -o TRACE.json`: a running job's spans as Chrome
 * trace-event JSON (Perfetto). ctl_top.c: `fsdpctl top [--once]`: a live view of jobs and nodes. */
int ctl_trace(int argc, char **argv);
int ctl_top(int argc, char **argv);

/* ctl_keys.c: `fsdpctl keygen FILE` writes a CURVE client keypair (mode 0600, never overwriting)
 * and prints the public key line for the daemon's STATE/keys/authorized (no daemon). */
int ctl_keygen(int argc, char **argv);

#endif
