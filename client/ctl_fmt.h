/* ctl_fmt — how fsdpctl shows daemon replies: human units, aligned tables, the progress line, and
 * the JSON objects of `--json` (jansson, snake_case keys).
 *
 * Pure functions of their arguments (the caller passes "now" where ages matter), so that every
 * output format is unit-tested without a daemon. Names of memory categories and collectives come
 * from plan.h (plan_mem_category_name, plan_coll_kind_name); the phase order is the wire's (RankStats.phase_us:
 * allgather wait, compute, reducescatter wait, optimizer). JSON objects returned are new
 * references owned by the caller (json_decref). Single-threaded, like fsdpctl.
 */
#ifndef FSDP_CTL_FMT_H
#define FSDP_CTL_FMT_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "fsdp.pb-c.h"

/* "512 B", "1.5 KiB", "12.0 MiB", "3.25 GiB" (binary units, 3 significant digits). */
char *ctl_fmt_bytes(uint64_t bytes, char *buf, size_t n);
/* "80GiB", "80G", "500MiB", "1.5GB", "4096" → bytes: K M G T and KiB MiB GiB TiB are powers of 1024, KB MB GB
 * TB of 1000 (as Hugging Face's max_shard_size); 0 if malformed, zero or too large. */
uint64_t ctl_parse_bytes(const char *s);
/* "950", "1.2k", "34.5M", "2.10G" (decimal, 3 significant digits); "-" for a negative or NaN. */
char *ctl_fmt_si(double x, char *buf, size_t n);
/* "0.4s", "45s", "1m12s", "2h03m", "3d04h"; "-" for a negative or non-finite value. */
char *ctl_fmt_duration(double seconds, char *buf, size_t n);
/* "queued", "starting", "running", "succeeded", "failed", "cancelled" ("unknown" otherwise). */
const char *ctl_fmt_state(Fsdp__JobState s);
int ctl_fmt_state_is_final(Fsdp__JobState s);
const char *ctl_fmt_device(Fsdp__DeviceKind d);          /* "cpu", "cuda" */

/* Seconds left at STEP of STEPS when the run started (or resumed) at START_STEP ELAPSED_S seconds
 * ago; -1 when there is no rate yet. */
double ctl_fmt_eta(unsigned step, unsigned steps, unsigned start_step, double elapsed_s);
/* The progress line, without \r or \n: "[#####.....] step 40/200  loss 3.214  1.2k tok/s  ETA 1m12s".
 * LOSS or TOKENS_PER_S ≤ 0 or NaN (not yet known) are left out; ETA_S < 0 prints "ETA -", NaN
 * leaves the ETA out (the job has ended). */
char *ctl_fmt_progress(char *buf, size_t n, unsigned step, unsigned steps, double loss, double val_loss,
                       double tokens_per_s, double eta_s, int bar_width);

/* An aligned text table: columns are left-aligned unless their header starts with '>' (then the
 * '>' is dropped and the column is right-aligned). Rows are copied. */
typedef struct ctl_table ctl_table;
ctl_table *ctl_table_new(int ncols, const char *const *headers);
void ctl_table_add(ctl_table *t, const char *const *cells);   /* ncols cells; NULL prints "" */
void ctl_table_print(const ctl_table *t, FILE *f, const char *indent);
void ctl_table_destroy(ctl_table **t);

/* JSON: {"rank", "peak_bytes": {param_shard..comm}, "cur_bytes": {...}, "phase_ms": {allgather,
 * compute, reducescatter, optimizer}, "sent_bytes": {allgather, reducescatter, allreduce}} —
 * the shape of a metrics.jsonl "ranks" entry. Arrays missing from the message are left out. */
json_t *ctl_fmt_rank_json(const Fsdp__RankStats *r);
/* {"step", "loss", "lr", "grad_norm", "tokens", "step_ms", "tokens_per_s", "ranks": [...]} */
/* A step as JSON: its fields, step_ms_rank, detail_step when set, agg (metrics.jsonl's form) and ranks. */
json_t *ctl_fmt_step_json(const Fsdp__StepSummary *s);
/* Up to this many ranks a step's figures are shown per rank; beyond, as min / median / max. */
#define CTL_FMT_RANKS_MAX 16
/* {"id", "name", "state", "step", "steps", "loss", "tokens_per_s", "world", "device",
 *  "submitted_at", "started_at", "finished_at" (Unix seconds or null), "job_dir", "reason" (only
 *  when non-empty), "last" (the last step's summary, or null)} */
json_t *ctl_fmt_job_json(const Fsdp__JobInfo *j);
/* {"nodes": [{"id", "name", "lost", "last_seen", "devices": [{"kind", "index", "name", "mem_bytes",
 *  "job_id" (null when free), "rank"}]}]} */
json_t *ctl_fmt_nodes_json(const Fsdp__NodesResp *r);

/* Human renderings. NOW is the current Unix time (for ages). */
void ctl_fmt_job_human(const Fsdp__JobInfo *j, double now, FILE *f);
void ctl_fmt_jobs_table(Fsdp__JobInfo *const *jobs, size_t n, double now, FILE *f);
void ctl_fmt_nodes_table(const Fsdp__NodesResp *r, double now, FILE *f);

/* Print J as one line of indented JSON text to F (with a trailing newline); steals J. */
int ctl_fmt_print_json(json_t *j, FILE *f);

#endif
