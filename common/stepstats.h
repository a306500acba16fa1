/* stepstats — the names of the per-step figures that the step reports carry and that
 * metrics.jsonl, `fsdpctl status` and the runtime share: the time phases of a step, in the order
 * of the StepStats.phase_us array (proto/fsdp.proto).
 *
 * Constant data; any thread may read it.
 */
#ifndef FSDP_STEPSTATS_H
#define FSDP_STEPSTATS_H

#define STEPSTATS_NPHASE 4
/* "allgather", "compute", "reducescatter", "optimizer": all-gather wait, compute, reduce-scatter
 * wait, optimizer; the JSON keys of metrics.jsonl's ranks[].phase_ms. */
extern const char *const stepstats_phase_names[STEPSTATS_NPHASE];

#endif
