/* steps — the step pipeline of a running job: steps granted to the job's nodes, one aggregate per
 * node per step merged into one metrics.jsonl line and one database row, then the stop.
 *
 * When every rank is ready (steps_on_ready) the steps up to STEP_WINDOW beyond the last recorded one
 * are granted to every node of the job at once (one node_step_cmd per node; the node's relay hands
 * them to its ranks, relay.h), and granted again each time no more than STEP_REGRANT are left. Each
 * node answers each step with one node_step_report, the figures of its ranks folded (stepagg.h); the
 * coordinator's work per step is O(nodes), whatever the ranks per node. A report outside the steps in
 * flight, from a node without ranks of the job, or a duplicate is logged and ignored.
 * Every rank's full figures ride along every steps_detail_every(world) steps (every step up to
 * STEPS_DETAIL_ALL_MAX ranks) and go into that step's metrics line; `fsdpctl status --rank R` asks
 * for R's on every step (job_steps_view.detail_rank). After the last step (JE_STEP_RECORDED: the job is
 * stopping) every rank gets stop_cmd.
 * Loop thread only.
 */
#ifndef FSDP_DAEMON_STEPS_H
#define FSDP_DAEMON_STEPS_H

#include "coord_core.h"
#include "job.h"

/* Rank R of J is ready to train from RD->start_step; the last one starts the steps. */
void steps_on_ready(coord_t *c, job_t *j, int r, const Fsdp__WorkerReady *rd);
#define STEPS_DETAIL_ALL_MAX 64   /* up to this many ranks, every rank's figures on every step */
#define STEPS_DETAIL_EVERY 100    /* above, on every this many steps up to STEPS_DETAIL_RANKS ranks, */
#define STEPS_DETAIL_RANKS 512    /* and beyond, on every 100·⌈world / 512⌉ (docs/performance.md) */
/* K, the steps between two steps that carry every rank's figures, for WORLD ranks: the detail
 * costs the coordinator O(world) once every K steps, so K grows with the world to keep its share
 * of a step's cost the same at any size (800 steps at 4,096 ranks). */
uint32_t steps_detail_every(int world);

/* A node_step_report from node N; takes *MP when it keeps it. */
void steps_on_node_report(coord_t *c, node_t *n, Fsdp__Msg **mp);
/* `fsdpctl status --rank R` of J (NULL: a job no longer active): from now on R's full figures ride
 * on every step of J; returns its latest figures, from the coordinator's last copy or from LINE
 * (the last step's parsed metrics line, NULL-safe), whichever is newer, and their step in *STEP
 * (NULL, 0: none yet). The pointer lives until the next step of J or the end of LINE. */
const Fsdp__RankStats *steps_rank_detail(job_t *j, uint32_t rank, const Fsdp__StepSummary *line, uint32_t *step);

/* On every tick: a held error whose grace passed fails the job, naming the ranks that went silent
 * (or the lost node, if one is about to be declared); a passed start or step deadline fails it,
 * naming every rank that did not arrive. */
void steps_check(coord_t *c, job_t *j, double now);

/* A stop of J: EV is JE_USER_STOP (fsdpctl stop) or JE_SHUTDOWN (the daemon's), fed to the job
 * (job.h). Where it sets a stop that checkpoints, the next step not yet sent saves a checkpoint and
 * is the job's last, granted at once; the job then ends cancelled ("stopped by the user after step
 * N"), or for the shutdown is queued again. Otherwise the job decides (a cancel, a queue). */
void steps_stop(coord_t *c, job_t *j, job_ev ev);

#endif
