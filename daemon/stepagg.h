/* stepagg — one step's per-rank figures reduced over many ranks, so that what the coordinator
 * receives, keeps and writes per step does not grow with the ranks (docs/performance.md "Scale").
 *
 * A figure is one number per rank: the standard ones (STEPAGG_NSTD, in this order: peak_bytes and
 * cur_bytes per memory category, phase_us per phase, sent_bytes and sent_inter_bytes per collective,
 * step_us, eval_us) and any extra named figure a rank sends (RankStats.extra: a checkpoint save's
 * figures, for one), each kept as count, sum, min and max with the rank holding each (the lowest
 * rank on a tie) and a histogram of log-spaced buckets (STEPAGG_GAMMA apart) for the median.
 * Aggregates merge exactly (min, max, their ranks, sum, count, histogram), so a node agent folds its
 * ranks' reports into one and the coordinator merges one per node. The median is the lower median's
 * bucket, reported as that bucket's centre clamped into [min, max]: within STEPAGG_MEDIAN_RTOL of the
 * true lower median, and exact when every rank reported the same value.
 *
 * An aggregate is owned by its creator; not thread-safe (the agent's and the coordinator's loop).
 */
#ifndef FSDP_DAEMON_STEPAGG_H
#define FSDP_DAEMON_STEPAGG_H

#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "fsdp.pb-c.h"
#include "plan.h"
#include "stepstats.h"

#define STEPAGG_NSTD STEPSTATS_NFIG_STD   /* named by stepstats_figure_name */
#define STEPAGG_GAMMA 1.02
#define STEPAGG_MEDIAN_RTOL 0.02   /* γ - 1: the width of a bucket */
#define STEPAGG_NBUCKET 2300       /* bucket 0 holds 0; bucket b ≥ 1 holds [γ^(b-1), γ^b): all of uint64 */
#define STEPAGG_MAX_FIGS (STEPAGG_NSTD + 64)

typedef struct stepagg stepagg;

fsdp_status stepagg_new(stepagg **out);
void stepagg_destroy(stepagg **a);   /* NULL-safe; clears *A */
void stepagg_reset(stepagg *a);      /* back to no ranks; extra names are forgotten */

/* Fold in one rank's figures: S (its rank, arrays, extras) and its step and eval time. */
fsdp_status stepagg_add_rank(stepagg *a, const Fsdp__RankStats *s, double step_ms, double eval_ms);
/* Fold in one extra figure NAME of RANK (a figure the rank's RankStats does not carry: its
 * checkpoint save's, which a node agent reads from the rank's report). */
fsdp_status stepagg_add_value(stepagg *a, const char *name, uint64_t v, uint32_t rank);
/* Merge an aggregate received on the wire (validated by wire.c). */
fsdp_status stepagg_merge(stepagg *a, const Fsdp__StepAgg *m);
uint32_t stepagg_ranks(const stepagg *a);

/* Fill *M (its arrays malloc'd; free with stepagg_msg_free) from A; WITH_MEDIAN adds the medians
 * (the coordinator's final figures; a node agent leaves them out). */
fsdp_status stepagg_to_msg(const stepagg *a, int with_median, Fsdp__StepAgg *m);
void stepagg_msg_free(Fsdp__StepAgg *m);

/* The histogram bucket of V (exposed for the tests). */
uint32_t stepagg_bucket(uint64_t v);

#endif
