/* stepstats — the names of the per-step figures that the step reports carry and that
 * metrics.jsonl, `fsdpctl status` and the runtime share: the time phases of a step, in the order
 * of the StepStats.phase_us array (proto/fsdp.proto), and the names of an aggregate's figures.
 *
 * Constant data; any thread may read it.
 */
#ifndef FSDP_STEPSTATS_H
#define FSDP_STEPSTATS_H

#include <stddef.h>

#include "fsdp.pb-c.h"

#define STEPSTATS_NPHASE 4
/* "allgather", "compute", "reducescatter", "optimizer": all-gather wait, compute, reduce-scatter
 * wait, optimizer; the JSON keys of metrics.jsonl's ranks[].phase_ms. */
extern const char *const stepstats_phase_names[STEPSTATS_NPHASE];

/* The figures a step aggregate carries (StepAgg, daemon/stepagg.h): the standard ones first, in this
 * order: peak_bytes and cur_bytes per memory category, phase_us per phase, sent_bytes and
 * sent_inter_bytes per collective, step_us, eval_us; then extras by name. */
#define STEPSTATS_NFIG_STD (2 * 7 + STEPSTATS_NPHASE + 2 * 3 + 2)
/* Figure I's group and key in aggregate M: ("peak_bytes", "param_shard"), ..., ("step_us", NULL),
 * and for extras ("extra", NAME). */
void stepstats_figure_name(const Fsdp__StepAgg *m, size_t i, const char **group, const char **key);

#endif
