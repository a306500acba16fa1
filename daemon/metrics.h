/* metrics — one step of a job as the metrics.jsonl line (jansson), from the ranks' step reports.
 *
 * The line is a JSON object: step (from 1; its loss is the one computed before that step's
 * update), loss (mean over all ranks' tokens), lr, grad_norm, tokens, step_ms (the slowest rank's
 * step time), tokens_per_s (tokens / step_ms), and ranks: one object per rank in rank order,
 * {rank, peak_bytes: {category: bytes}, cur_bytes: {category: bytes}, phase_ms: {allgather,
 * compute, reducescatter, optimizer}, sent_bytes: {allgather, reducescatter, allreduce}}; and
 * checkpoint (below) on the steps after which saves became complete.
 * Pure functions; any thread.
 */
#ifndef FSDP_DAEMON_METRICS_H
#define FSDP_DAEMON_METRICS_H

#include <stddef.h>

#include "err.h"
#include "fsdp.pb-c.h"

/* Fill SUM's job-wide fields from the reports of every rank (REPORTS[r] is rank r's, all
 * non-NULL, N of them): loss, lr, grad_norm and tokens from rank 0 (they are global),
 * step_ms the maximum, tokens_per_s = tokens·1000/step_ms. Leaves sum->ranks alone. */
void metrics_summarize(Fsdp__StepReport *const *reports, size_t n, Fsdp__StepSummary *sum);

/* Save I of the step's reports (every rank reports the same saves) as the job saw it: the longest
 * blocked, wait and write times, the bytes of every rank's file. */
void metrics_ckpt(Fsdp__StepReport *const *reports, size_t n, size_t i, Fsdp__CkptSave *out);

/* The metrics.jsonl line (no trailing newline) for REPORTS; *line is malloc'd. It carries
 * "checkpoint": [{step, blocked_s, wait_s, write_s, bytes, mb_per_s}] (metrics_ckpt) when saves
 * became complete after the step. */
fsdp_status metrics_line(Fsdp__StepReport *const *reports, size_t n, char **line);

/* The inverse for one line: fill SUM->ranks (allocated; free with metrics_free_ranks) from the
 * "ranks" array of a metrics.jsonl LINE. A line without ranks leaves n_ranks 0. */
fsdp_status metrics_parse_ranks(const char *line, Fsdp__StepSummary *sum);
void metrics_free_ranks(Fsdp__StepSummary *sum);

#endif
