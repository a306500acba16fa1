/* promx — see promx.h. */
#define _GNU_SOURCE
#include "promx.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

/* Peak dense bf16 tensor FLOP/s from the vendors' data sheets (SXM parts; a PCIe part of the
 * same name is slower, so its MFU reads high). Matched as a substring of the CUDA product name. */
static const struct {
  const char *name;
  double flops;
} peaks[] = {
  {"H200", 989e12}, {"H100", 989e12}, {"A100", 312e12}, {"L40S", 362e12}, {"A10G", 70e12}, {"L4", 121e12},
};

double promx_peak_flops(const char *name) {
  for (size_t i = 0; name && i < sizeof peaks / sizeof peaks[0]; i++)
    if (strstr(name, peaks[i].name)) return peaks[i].flops;
  return 0;
}

fsdp_status promx_set_state(promx_job **pxp, uint64_t id, const char *name, int state) {
  if (!*pxp) {
    *pxp = calloc(1, sizeof **pxp);
    if (!*pxp) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the metrics of job %llu", (unsigned long long)id);
    (*pxp)->mfu = -1;
  }
  (*pxp)->id = id;
  snprintf((*pxp)->name, sizeof (*pxp)->name, "%s", name);
  (*pxp)->state = state;
  return FSDP_OK;
}

fsdp_status promx_on_step(promx_job **pxp, uint64_t id, const char *name, int state, const Fsdp__StepSummary *sum,
                          size_t world, double flops_per_token, double peak_flops) {
  fsdp_status rc = promx_set_state(pxp, id, name, state);
  if (rc != FSDP_OK) return rc;
  promx_job *px = *pxp;
  /* per-rank series only for jobs whose every step carries every rank (bounded: PROMX_RANK_SERIES_MAX) */
  size_t n = world <= PROMX_RANK_SERIES_MAX && sum->n_ranks == world ? world : 0;
  if ((size_t)px->world < n) {   /* first step, or a restart with more ranks: the counters so far stay */
    promx_rank *r = realloc(px->ranks, n * sizeof *r);
    if (!r) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the metrics of job %llu", (unsigned long long)id);
    memset(r + px->world, 0, (n - (size_t)px->world) * sizeof *r);
    px->ranks = r;
    px->world = (int)n;
  }
  px->step = sum->step;
  px->loss = sum->loss;
  px->tokens_per_s = sum->tokens_per_s;
  px->has_val = sum->has_val;
  if (sum->has_val) px->val_loss = sum->val_loss;
  px->mfu = peak_flops > 0 ? flops_per_token * sum->tokens_per_s / peak_flops : -1;
  px->tokens_total += sum->tokens;
  px->steps_total++;
  if (sum->n_ckpt) {   /* the latest save that completed (the lowest rank's figures) */
    const Fsdp__CkptSave *k = sum->ckpt[sum->n_ckpt - 1];
    px->has_ckpt = 1;
    px->ckpt_blocked_s = k->blocked_s, px->ckpt_write_s = k->write_s, px->ckpt_bytes = k->bytes;
  }
  for (size_t i = 0; i < n; i++) {
    const Fsdp__RankStats *s = sum->ranks[i];
    promx_rank *r = &px->ranks[i];
    for (size_t k = 0; k < MEM_NCAT; k++) r->peak_bytes[k] = k < s->n_peak_bytes ? s->peak_bytes[k] : 0;
    for (size_t k = 0; k < STEPSTATS_NPHASE && k < s->n_phase_us; k++) r->phase_s[k] += (double)s->phase_us[k] * 1e-6;
    for (size_t k = 0; k < COLL_NKIND && k < s->n_sent_bytes; k++) r->sent_bytes[k] += s->sent_bytes[k];
    for (size_t k = 0; k < COLL_NKIND && k < s->n_sent_inter_bytes; k++) r->sent_inter_bytes[k] += s->sent_inter_bytes[k];
  }
  return FSDP_OK;
}

void promx_job_free(promx_job **pxp) {
  if (!pxp || !*pxp) return;
  free((*pxp)->ranks);
  free(*pxp);
  *pxp = NULL;
}

void promx_expire(promx_job **done, double now) {
  int k = 0;
  for (promx_job **p = done; *p;) {
    if (now - (*p)->ended_at > PROMX_KEEP_S || ++k > PROMX_KEEP_JOBS) {
      promx_job *dead = *p;
      *p = dead->next;
      promx_job_free(&dead);
    } else {
      p = &(*p)->next;
    }
  }
}

void promx_retire(promx_job **done, promx_job **pxp, double now) {
  promx_job *px = *pxp;
  if (!px) return;
  *pxp = NULL;
  px->ended_at = now;
  px->next = *done;
  *done = px;
  promx_expire(done, now);
}

/* ---------------------------------------------------------------- rendering */

/* A label value: backslash, double quote and newline escaped (the text format's rules). */
static void put_label(FILE *f, const char *s) {
  for (; *s; s++) {
    if (*s == '\\') fputs("\\\\", f);
    else if (*s == '"') fputs("\\\"", f);
    else if (*s == '\n') fputs("\\n", f);
    else fputc(*s, f);
  }
}

static void head(FILE *f, const char *metric, const char *type, const char *help) {
  fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", metric, help, metric, type);
}

/* metric{job="ID",name="NAME"  — the caller closes the braces */
static void job_labels(FILE *f, const char *metric, const promx_job *px) {
  fprintf(f, "%s{job=\"%llu\",name=\"", metric, (unsigned long long)px->id);
  put_label(f, px->name);
  fputc('"', f);
}

/* A floating value in the text format: Go's ParseFloat reads %.17g, NaN and ±Inf by those names. */
static void put_value(FILE *f, double v) {
  if (v != v) fputs(" NaN\n", f);
  else if (v > 1.7e308) fputs(" +Inf\n", f);
  else if (v < -1.7e308) fputs(" -Inf\n", f);
  else fprintf(f, " %.17g\n", v);
}

/* Every job record of view V, in its order. */
#define FOR_JOBS(V, PX) for (size_t i_ = 0; i_ < (V)->njobs && ((PX) = (V)->jobs[i_]); i_++)

/* The state label's values: fsdp.JobState's names (docs/observability.md). */
static const char *state_label(int s) {
  switch (s) {
  case FSDP__JOB_STATE__QUEUED: return "queued";
  case FSDP__JOB_STATE__STARTING: return "starting";
  case FSDP__JOB_STATE__RUNNING: return "running";
  case FSDP__JOB_STATE__SUCCEEDED: return "succeeded";
  case FSDP__JOB_STATE__FAILED: return "failed";
  case FSDP__JOB_STATE__CANCELLED: return "cancelled";
  default: return "?";
  }
}

typedef enum { JV_LOSS, JV_STEP, JV_TPS, JV_VAL, JV_MFU, JV_TOKENS, JV_STEPS, JV_CK_BLOCKED, JV_CK_WRITE, JV_CK_BYTES } job_value;

static void job_series(FILE *f, const promx_view *v, job_value which, const char *metric, const char *type,
                       const char *help) {
  const promx_job *px;
  head(f, metric, type, help);
  FOR_JOBS(v, px) {
    double v;
    switch (which) {
    case JV_LOSS: if (!px->steps_total) continue; v = px->loss; break;
    case JV_STEP: v = px->step; break;
    case JV_TPS: if (!px->steps_total) continue; v = px->tokens_per_s; break;
    case JV_VAL: if (!px->has_val) continue; v = px->val_loss; break;
    case JV_MFU: if (px->mfu < 0) continue; v = px->mfu; break;
    case JV_TOKENS: v = (double)px->tokens_total; break;
    case JV_CK_BLOCKED: if (!px->has_ckpt) continue; v = px->ckpt_blocked_s; break;
    case JV_CK_WRITE: if (!px->has_ckpt) continue; v = px->ckpt_write_s; break;
    case JV_CK_BYTES: if (!px->has_ckpt) continue; v = (double)px->ckpt_bytes; break;
    default: v = (double)px->steps_total; break;
    }
    job_labels(f, metric, px);
    fputc('}', f);
    put_value(f, v);
  }
}

static void job_state_series(FILE *f, const promx_view *v) {
  const promx_job *px;
  head(f, "fsdp_job_state", "gauge", "1 for the job's current state, 0 for the others");
  FOR_JOBS(v, px) {
    for (int s = FSDP__JOB_STATE__QUEUED; s <= FSDP__JOB_STATE__CANCELLED; s++) {
      job_labels(f, "fsdp_job_state", px);
      fprintf(f, ",state=\"%s\"} %d\n", state_label(s), px->state == s);
    }
  }
}

typedef enum { RV_PEAK, RV_PHASE, RV_SENT, RV_SENT_INTER } rank_value;

/* Whether any rank of PX sent bytes across shard groups (a hybrid job that has run a step). */
static int crossed_groups(const promx_job *px) {
  for (int r = 0; r < px->world; r++)
    for (int k = 0; k < COLL_NKIND; k++)
      if (px->ranks[r].sent_inter_bytes[k]) return 1;
  return 0;
}

static void rank_series(FILE *f, const promx_view *v, rank_value which, const char *metric, const char *type,
                        const char *label, const char *help) {
  const promx_job *px;
  head(f, metric, type, help);
  int nk = which == RV_PEAK ? MEM_NCAT : which == RV_PHASE ? STEPSTATS_NPHASE : COLL_NKIND;
  FOR_JOBS(v, px) {
    if (which == RV_SENT_INTER && !crossed_groups(px)) continue;   /* hybrid jobs only */
    for (int r = 0; r < px->world; r++) {
      const promx_rank *rk = &px->ranks[r];
      for (int k = 0; k < nk; k++) {
        const char *kn = which == RV_PEAK ? plan_mem_category_name((mem_category)k)
                         : which == RV_PHASE ? stepstats_phase_names[k] : plan_coll_kind_name((coll_kind)k);
        fprintf(f, "%s{job=\"%llu\",rank=\"%d\",%s=\"%s\"}", metric, (unsigned long long)px->id, r, label, kn);
        if (which == RV_PHASE) put_value(f, rk->phase_s[k]);
        else fprintf(f, " %llu\n", (unsigned long long)(which == RV_PEAK   ? rk->peak_bytes[k]
                                                         : which == RV_SENT ? rk->sent_bytes[k]
                                                                            : rk->sent_inter_bytes[k]));
      }
    }
  }
}

static const char *kind_name(int kind) { return kind == FSDP__DEVICE_KIND__DEVICE_KIND_CPU ? "cpu" : "cuda"; }

static void node_series(FILE *f, const promx_view *v) {
  head(f, "fsdp_node_up", "gauge", "1 while the node's agent sends heartbeats, 0 once it is lost or stopped");
  for (size_t i = 0; i < v->nnodes; i++) {
    fputs("fsdp_node_up{node=\"", f);
    put_label(f, v->nodes[i].name);
    fprintf(f, "\"} %d\n", v->nodes[i].up);
  }
  head(f, "fsdp_node_devices", "gauge", "device slots of the node by kind and state (busy: running a rank of a job)");
  for (size_t i = 0; i < v->nnodes; i++) {
    const promx_node *n = &v->nodes[i];
    const int (*count)[2] = n->devices;
    for (int g = 0; g < 2; g++) {
      if (!count[g][0] && !count[g][1]) continue;
      for (int b = 0; b < 2; b++) {
        fputs("fsdp_node_devices{node=\"", f);
        put_label(f, n->name);
        fprintf(f, "\",kind=\"%s\",state=\"%s\"} %d\n",
                kind_name(g ? FSDP__DEVICE_KIND__DEVICE_KIND_CUDA : FSDP__DEVICE_KIND__DEVICE_KIND_CPU), b ? "busy" : "free",
                count[g][b]);
      }
    }
  }
}

fsdp_status promx_render(const promx_view *v, char **text, size_t *len) {
  *text = NULL;
  *len = 0;
  FILE *f = open_memstream(text, len);
  if (!f) return fsdp_set_error(FSDP_ERR_NOMEM, "cannot render the metrics");
  job_series(f, v, JV_LOSS, "fsdp_job_loss", "gauge", "training loss of the latest step (metrics.jsonl's last line)");
  job_series(f, v, JV_VAL, "fsdp_job_val_loss", "gauge", "latest validation loss ([eval]); absent before the first");
  job_series(f, v, JV_STEP, "fsdp_job_step", "gauge", "latest completed step");
  job_series(f, v, JV_TPS, "fsdp_job_tokens_per_second", "gauge", "tokens per second of the latest step");
  job_series(f, v, JV_CK_BLOCKED, "fsdp_checkpoint_blocked_seconds", "gauge",
             "time training stopped for the latest complete checkpoint save (the slowest rank)");
  job_series(f, v, JV_CK_WRITE, "fsdp_checkpoint_write_seconds", "gauge",
             "time the latest complete checkpoint save took to write (the slowest rank's file)");
  job_series(f, v, JV_CK_BYTES, "fsdp_checkpoint_bytes", "gauge", "bytes of the latest complete checkpoint (every rank's file)");
  job_series(f, v, JV_MFU, "fsdp_job_mfu", "gauge",
             "model FLOPs utilization of the latest step (0..1); only for devices with a known peak");
  job_series(f, v, JV_TOKENS, "fsdp_job_tokens_total", "counter", "tokens trained, over every attempt");
  job_series(f, v, JV_STEPS, "fsdp_job_steps_total", "counter", "steps completed, over every attempt");
  job_state_series(f, v);
  rank_series(f, v, RV_PEAK, "fsdp_rank_memory_peak_bytes", "gauge", "category",
              "peak bytes by memory category within the latest step");
  rank_series(f, v, RV_PHASE, "fsdp_rank_phase_seconds_total", "counter", "phase",
              "seconds spent per step phase, summed over steps");
  rank_series(f, v, RV_SENT, "fsdp_rank_sent_bytes_total", "counter", "collective",
              "bytes sent by each collective, summed over steps");
  rank_series(f, v, RV_SENT_INTER, "fsdp_rank_sent_inter_bytes_total", "counter", "collective",
              "the part of those bytes sent across shard groups (sharding = hybrid jobs only), summed over steps");
  node_series(f, v);
  head(f, "fsdp_malformed_messages_total", "counter", "malformed messages received and dropped");
  fprintf(f, "fsdp_malformed_messages_total %llu\n", (unsigned long long)v->bad_msgs);
  if (fclose(f) != 0 || !*text) {
    free(*text);
    *text = NULL;
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot render the metrics");
  }
  return FSDP_OK;
}
