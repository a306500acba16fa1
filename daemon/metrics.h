/* metrics — one step of a job as the metrics.jsonl line (jansson), and back.
 *
 * The line is a JSON object: step (from 1; its loss is the one computed before that step's
 * update), loss (mean over all ranks' tokens), lr, grad_norm, tokens, step_ms (the slowest rank's
 * step time), tokens_per_s (tokens / step_ms), step_ms_rank (the slowest rank), val_loss and
 * eval_ms on evaluation steps; agg: every per-rank figure reduced over the ranks (stepagg.h),
 * {ranks, GROUP: {KEY: {min, min_rank, median, max, max_rank, sum[, count]}}} with the groups
 * peak_bytes, cur_bytes (per memory category), phase_us (allgather, compute, reducescatter,
 * optimizer), sent_bytes, sent_inter_bytes (per collective), step_us, eval_us, extra (by name);
 * and on detail steps of jobs up to 64 ranks (steps.h) ranks: one object per rank in rank order,
 * {rank, peak_bytes: {category: bytes}, cur_bytes: {category: bytes}, phase_ms: {allgather,
 * compute, reducescatter, optimizer}, sent_bytes: {allgather, reducescatter, allreduce}, and the
 * rank's extra figures by name}. Beyond 64 ranks the ranks go to ranks.jsonl instead
 * (metrics_ranks_line), so that a line's size is the aggregate's whatever the ranks; and
 * "checkpoint": [{step, blocked_s, wait_s, write_s, bytes, mb_per_s, ranks, blocked_rank,
 * write_rank, inflight_steps, inflight_step_ms, before_step_ms, step_slowdown}] after the steps that
 * completed saves (the job's: the longest times over the ranks, every rank's bytes; the steps' pace
 * while the write was in flight, ckptpace.h, null where unknown). Pure
 * functions; any thread.
 */
#ifndef FSDP_DAEMON_METRICS_H
#define FSDP_DAEMON_METRICS_H

#include <stddef.h>

#include "err.h"
#include "fsdp.pb-c.h"

/* The metrics.jsonl line (no trailing newline) of step SUM: its job-wide fields, SUM->agg (with
 * medians) when set, SUM->ranks when any; *line is malloc'd. */
fsdp_status metrics_line(const Fsdp__StepSummary *sum, char **line);

/* The ranks.jsonl line of SUM (jobs beyond 64 ranks keep every rank's figures there, steps.h):
 * {"step", "ranks": [as in metrics.jsonl]}; *line is malloc'd. */
fsdp_status metrics_ranks_line(const Fsdp__StepSummary *sum, char **line);
/* [eval] at_start: metrics.jsonl's step-0 line {"step": 0, "val_loss", "eval_ms"} from FIRST, the
 * first step's report that carries it (its eval_ms the slowest of its node's ranks); malloc'd. */
fsdp_status metrics_start_line(const Fsdp__StepReport *first, char **line);

/* The inverse for what `fsdpctl status` shows: fill SUM->ranks, SUM->agg (allocated; free with
 * metrics_free_line), step_ms_rank and the trained tokens from a metrics.jsonl LINE; what the line lacks
 * stays empty. */
fsdp_status metrics_parse_line(const char *line, Fsdp__StepSummary *sum);
void metrics_free_line(Fsdp__StepSummary *sum);

#endif
