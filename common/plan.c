/* plan — units, shard map, memory and communication model; see plan.h and docs/memory.md.
 *
 * Every formula of the model lives once, in model_memory() and model_comm(), which work from
 * the model shape and the world size alone: plan_build() fills plan_t with them, plan_min_world()
 * searches world sizes without building whole plans, and the table shows every sharding mode.
 */
#include "plan_priv.h"

#include "arch.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_MAX_WORLD 4096   /* jobspec's [fsdp] world_size range */

const char *plan_mem_category_name(mem_category c) {
  static const char *const names[MEM_NCAT] = {"param_shard", "grad_shard", "optim_state", "gathered",
                                              "activations", "workspace", "comm"};
  return (unsigned)c < MEM_NCAT ? names[c] : "?";
}

const char *plan_coll_kind_name(coll_kind k) {
  static const char *const names[COLL_NKIND] = {"allgather", "reducescatter", "allreduce"};
  return (unsigned)k < COLL_NKIND ? names[k] : "?";
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* The share of causal attention's scores at T that a window of W keys computes: Σ_t min(t + 1, W) over
 * Σ_t (t + 1), t < T; 1 for W = 0 (full) or W ≥ T. Full attention keeps PaLM's count (12·C·T a layer,
 * causality not halved), so a window is counted as that times its share. */
static double window_share(int64_t W, int64_t T) {
  if (W <= 0 || W >= T) return 1.0;
  return ((double)W * (double)(W + 1) / 2 + (double)(T - W) * (double)W) / ((double)T * (double)(T + 1) / 2);
}

/* The architecture of M (plan_build and plan_min_world checked it is one of the table's). */
static const arch_desc *arch_of(const model_config *m) { return arch_get(m->arch); }

int64_t plan_attention_floats(device_kind dev, int64_t B, int64_t T, int64_t H) {
  return dev == DEVICE_CPU ? B * H * T * T : B * H * T;
}

int64_t plan_attention_scratch_floats(device_kind dev, int64_t B, int64_t T, int64_t H, int64_t HS) {
  return dev == DEVICE_CPU ? B * H * T * T : B * H * T * (HS + 1);
}

int64_t plan_classifier_chunk(int64_t BT, int64_t V) {
  if (BT <= 0 || V <= 0) return 0;
  int64_t row = 2 * round_up(V, 128), most = PLAN_CUDA_LOGITS_MAX_BYTES / row;
  if (most < 1) most = 1;
  int64_t n = (BT + most - 1) / most;   /* chunks */
  return (BT + n - 1) / n;
}

int64_t plan_vocab_padded(device_kind dev, int64_t V) { return dev == DEVICE_CPU ? V : round_up(V, 128); }

int64_t plan_logits_bytes(device_kind dev, int64_t BT, int64_t V, int64_t C) {
  if (dev == DEVICE_CPU) return 4 * BT * V;
  int64_t Vp = plan_vocab_padded(dev, V), head = Vp == V ? 0 : Vp * C * (2 + 4);
  return 2 * plan_classifier_chunk(BT, V) * Vp + head;
}

int64_t plan_stage_bytes(const plan_t *p) {
  int64_t most = 0;
  for (int u = 0; u < p->nunits; u++) {
    int64_t b = 4 * ((int64_t)p->shard_world + 1) * p->units[u].shard_numel;
    if (b > most) most = b;
  }
  return most < PLAN_STAGE_MAX_BYTES ? most : PLAN_STAGE_MAX_BYTES;
}

/* The inputs of the memory and communication model: everything it depends on. */
typedef struct model_in {
  model_config m;
  int world, batch_size, grad_accum, prefetch;
  int group;          /* ranks per shard group: G for hybrid, the world for full and grad_op, 1 for none */
  shard_mode sharding;
  dtype_kind param_dtype, reduce_dtype;
  device_kind device;
  ackpt_mode ackpt;
  offload_mode offload;
  int docs;           /* rows may hold several documents: the device copy of their starts (plan_t.docs) */
} model_in;

typedef struct unit_sizes {
  int shard_world;
  int64_t pr, pb;     /* padded root, padded block */
  int64_t sr, sb;     /* shard_numel of root and of a block */
} unit_sizes;

static unit_sizes sizes_for(const model_in *in, shard_mode mode) {
  unit_sizes u;
  u.shard_world = mode == SHARD_NONE ? 1 : mode == SHARD_HYBRID ? in->group : in->world;
  int64_t align = (int64_t)u.shard_world * PLAN_PAD_ALIGN;
  u.pr = round_up(arch_of(&in->m)->root_numel(&in->m), align);
  u.pb = round_up(arch_of(&in->m)->block_numel(&in->m), align);
  u.sr = u.pr / u.shard_world;
  u.sb = u.pb / u.shard_world;
  return u;
}

static void model_memory(const model_in *in, uint64_t mem[MEM_NCAT], uint64_t *total, uint64_t *host) {
  unit_sizes u = sizes_for(in, in->sharding);
  uint64_t L = (uint64_t)in->m.n_layer, p = (uint64_t)in->prefetch;
  uint64_t pb = (uint64_t)jobspec_dtype_bytes(in->param_dtype), rb = (uint64_t)jobspec_dtype_bytes(in->reduce_dtype);
  uint64_t S = (uint64_t)u.sr + L * (uint64_t)u.sb;
  plan_act a = arch_of(&in->m)->act(&in->m, in->batch_size, in->device, in->ackpt);
  /* the ring reduce-scatter's receive scratch: one shard of the largest unit (none with one rank) */
  uint64_t scratch = u.shard_world > 1 ? (uint64_t)(u.sr > u.sb ? u.sr : u.sb) : 0;
  /* the compute dtype: fp32 on the CPU, bf16 on CUDA; gathered units in another dtype are
   * converted into one root and one block buffer of it */
  uint64_t cb = in->device == DEVICE_CPU ? 4 : 2;
  uint64_t convert = pb != cb ? cb * ((uint64_t)u.pr + (uint64_t)u.pb) : 0;
  /* reduce-scatter buffers: fp32 gradients are reduced from the root's buffer and two alternating
   * block buffers; bf16 ones are computed in fp32 (root, one block), rounded into bf16 send
   * buffers (root, two blocks) and received into bf16 shards (root, two blocks) */
  uint64_t rs = in->reduce_dtype == DTYPE_FP32
                    ? 4 * ((uint64_t)u.pr + 2 * (uint64_t)u.pb + scratch)
                    : 4 * ((uint64_t)u.pr + (uint64_t)u.pb) + 2 * ((uint64_t)u.pr + 2 * (uint64_t)u.pb) +
                          2 * ((uint64_t)u.sr + 2 * (uint64_t)u.sb + scratch);
  mem[MEM_PARAM_SHARD] = 4 * S + (pb == 2 ? 2 * S : 0);   /* fp32 master, and its bf16 copy */
  mem[MEM_GRAD_SHARD] = 4 * S;
  mem[MEM_OPTIM_STATE] = 8 * S;
  switch (in->sharding) {
  case SHARD_HYBRID:   /* full sharding inside the group, plus the bf16 gradient shard all-reduced across groups */
    mem[MEM_GATHERED] = pb * ((uint64_t)u.pr + (1 + p < L ? 1 + p : L) * (uint64_t)u.pb) + convert;
    mem[MEM_COMM] = rs + (rb == 2 ? 2 * S : 0);
    break;
  case SHARD_FULL:
    mem[MEM_GATHERED] = pb * ((uint64_t)u.pr + (1 + p < L ? 1 + p : L) * (uint64_t)u.pb) + convert;
    mem[MEM_COMM] = rs;
    break;
  case SHARD_GRAD_OP:
    mem[MEM_GATHERED] = pb * ((uint64_t)u.pr + L * (uint64_t)u.pb) + convert;
    mem[MEM_COMM] = rs;
    break;
  default:
    mem[MEM_GATHERED] = convert;
    mem[MEM_COMM] = rb == 2 ? 2 * S : 0;   /* the bf16 copy of the gradient being all-reduced */
    break;
  }
  mem[MEM_COMM] += 4 * PLAN_STEP_SCALARS;   /* the step's scalars, all-reduced on the device */
  /* plus the step's token ids: inputs and targets of G micro-batches, B·T int32 each */
  mem[MEM_ACTIVATIONS] = L * (uint64_t)a.block_bytes + (uint64_t)a.block_ws_bytes + (uint64_t)a.root_bytes +
                         8 * (uint64_t)in->batch_size * (uint64_t)in->m.seq_len * (uint64_t)in->grad_accum;
  /* and, where rows may hold several documents, their starts: B·T int32 (model_set_docs) */
  if (in->docs) mem[MEM_ACTIVATIONS] += 4 * (uint64_t)in->batch_size * (uint64_t)in->m.seq_len;
  mem[MEM_WORKSPACE] = (uint64_t)(a.head_ws_bytes > a.bwd_ws_bytes ? a.head_ws_bytes : a.bwd_ws_bytes);
  /* the CUDA device's own: the ops workspace, its scalars, AdamW's decay segments (one per 2-D tensor) */
  if (in->device == DEVICE_CUDA)
    mem[MEM_WORKSPACE] += (uint64_t)PLAN_CUDA_WORKSPACE_BYTES + PLAN_CUDA_SCALAR_BYTES + 16 * (uint64_t)arch_of(&in->m)->n_decay(&in->m);
  /* offload = optimizer: the fp32 master, AdamW m and v, and a staging copy of the gradient shard
   * live in host memory; the device keeps the shard in param_dtype (what the gathers read) */
  if (host) *host = 0;
  if (in->offload == OFFLOAD_OPTIMIZER) {
    mem[MEM_PARAM_SHARD] = pb * S;
    mem[MEM_OPTIM_STATE] = 0;
    if (host) *host = 16 * S;
  }
  *total = 0;
  for (int c = 0; c < MEM_NCAT; c++) *total += mem[c];
}

/* Bytes one rank sends per optimizer step in sharding MODE (ring accounting, see plan.h); INTER
 * (may be NULL) gets the part sent over communicators that span shard groups (hybrid only). */
static void model_comm(const model_in *in, shard_mode mode, uint64_t sent[COLL_NKIND], uint64_t inter[COLL_NKIND]) {
  unit_sizes u = sizes_for(in, mode);
  uint64_t N = (uint64_t)in->world, G = (uint64_t)in->grad_accum, L = (uint64_t)in->m.n_layer;
  if (inter) memset(inter, 0, COLL_NKIND * sizeof *inter);
  uint64_t pb = (uint64_t)jobspec_dtype_bytes(in->param_dtype), rb = (uint64_t)jobspec_dtype_bytes(in->reduce_dtype);
  uint64_t S = (uint64_t)u.sr + L * (uint64_t)u.sb;
  uint64_t allreduced = 4 * PLAN_STEP_SCALARS;   /* bytes all-reduced once per step */
  memset(sent, 0, COLL_NKIND * sizeof *sent);
  switch (mode) {
  case SHARD_HYBRID: {
    /* full sharding among the group's Gs ranks; then each shard's gradient is all-reduced once per
     * step among the R = N/Gs ranks that hold it, one all-reduce per unit (each rounded down, as
     * the comm counts them), and the step's scalars over the whole world */
    uint64_t Gs = (uint64_t)u.shard_world, R = N / Gs;
    sent[COLL_ALLGATHER] = G * pb * (Gs - 1) * ((uint64_t)u.sr + 2 * L * (uint64_t)u.sb);
    sent[COLL_REDUCESCATTER] = G * rb * (Gs - 1) * S;
    uint64_t across = 2 * (R - 1) * rb * (uint64_t)u.sr / R + L * (2 * (R - 1) * rb * (uint64_t)u.sb / R);
    uint64_t scalars = 2 * (N - 1) * allreduced / N;
    sent[COLL_ALLREDUCE] = across + scalars;
    if (inter) inter[COLL_ALLREDUCE] = across + scalars;
    return;
  }
  case SHARD_FULL:
    /* an all-gather of a unit of P' elements sends shard_numel·(N−1) elements per rank */
    sent[COLL_ALLGATHER] = G * pb * (N - 1) * ((uint64_t)u.sr + 2 * L * (uint64_t)u.sb);
    sent[COLL_REDUCESCATTER] = G * rb * (N - 1) * S;
    break;
  case SHARD_GRAD_OP:
    sent[COLL_ALLGATHER] = G * pb * (N - 1) * S;
    sent[COLL_REDUCESCATTER] = G * rb * (N - 1) * S;
    break;
  default:
    allreduced += rb * ((uint64_t)u.pr + L * (uint64_t)u.pb);
    break;
  }
  sent[COLL_ALLREDUCE] = 2 * (N - 1) * allreduced / N;   /* rounded down */
}

/* What plan_build needs from a spec, checked so the arithmetic cannot overflow (the limits are
 * jobspec's ranges: a spec that came over the wire is checked again here). */
int plan_docs_of(const jobspec_t *s) {
  return s->pack && ((s->train[0] && !s->synthetic) || (s->val[0] && !s->val_synthetic));
}

static fsdp_status model_in_from_spec(const jobspec_t *s, int world, model_in *in) {
  const model_config *m = &s->model;
  if (world <= 0) world = s->world_size;
  if (world < 1 || world > PLAN_MAX_WORLD)
    return fsdp_set_error(FSDP_ERR_RANGE, "world size %d is out of range; allowed: 1..%d", world, PLAN_MAX_WORLD);
  if (m->n_layer < 1 || m->n_layer > 512 || m->n_head < 1 || m->n_head > 256 || m->n_embd < 1 ||
      m->n_embd > 32768 || m->vocab_size < 2 || m->vocab_size > 16777216 || m->seq_len < 1 || m->seq_len > 32768)
    return fsdp_set_error(FSDP_ERR_RANGE,
                          "model L=%d H=%d C=%d V=%d T=%d is out of range; allowed: L 1..512, H 1..256, "
                          "C 1..32768, V 2..16777216, T 1..32768",
                          m->n_layer, m->n_head, m->n_embd, m->vocab_size, m->seq_len);
  if (m->n_embd % m->n_head)
    return fsdp_set_error(FSDP_ERR_INVALID, "n_embd = %d is not divisible by n_head = %d; allowed: a multiple",
                          m->n_embd, m->n_head);
  if (m->n_positions < 0 || m->n_positions > (1 << 24) || (m->n_positions && m->n_positions < m->seq_len))
    return fsdp_set_error(FSDP_ERR_RANGE, "n_positions = %d is out of range; allowed: seq_len = %d..16777216 (0: seq_len)",
                          m->n_positions, m->seq_len);
  int nkv = m->n_kv_head ? m->n_kv_head : m->n_head;   /* 0: a hand-built config's "as n_head" */
  const arch_desc *d = arch_get(m->arch);
  if (!d) {
    char names[128];
    return fsdp_set_error(FSDP_ERR_INVALID, "model arch %d is out of range; allowed: %s", (int)m->arch,
                          arch_names(names, sizeof names, " | ", 0));
  }
  model_config mk = *m;
  mk.n_kv_head = nkv;
  TRY(d->check(&mk));
  if (s->batch_size < 1 || s->batch_size > 4096 || s->grad_accum < 1 || s->grad_accum > 4096)
    return fsdp_set_error(FSDP_ERR_RANGE, "batch_size %d / grad_accum %d out of range; allowed: 1..4096 each",
                          s->batch_size, s->grad_accum);
  if (s->prefetch < 0 || s->prefetch > 4)
    return fsdp_set_error(FSDP_ERR_RANGE, "prefetch %d is out of range; allowed: 0..4", s->prefetch);
  if ((unsigned)s->sharding > SHARD_HYBRID || (unsigned)s->param_dtype > DTYPE_BF16 ||
      (unsigned)s->reduce_dtype > DTYPE_BF16)
    return fsdp_set_error(FSDP_ERR_INVALID, "sharding or dtype out of range; allowed: full|grad_op|none|hybrid, fp32|bf16");
  int group = s->sharding == SHARD_NONE ? 1 : world;
  if (s->sharding == SHARD_HYBRID) {
    group = s->shard_group;
    if (group < 1)
      return fsdp_set_error(FSDP_ERR_INVALID, "[fsdp] sharding = hybrid: shard_group is not set and no placement is known "
                            "here; allowed: shard_group = the ranks per node (the coordinator sets it from its placement)");
    if (group > PLAN_MAX_WORLD || world % group || world == group)
      return fsdp_set_error(FSDP_ERR_INVALID, "%s", jobspec_hybrid_error(world, group));
  }
  *in = (model_in){.m = *m, .world = world, .group = group, .batch_size = s->batch_size, .grad_accum = s->grad_accum,
                   .prefetch = s->prefetch, .sharding = s->sharding,
                   .param_dtype = s->param_dtype, .reduce_dtype = s->reduce_dtype, .device = s->device,
                   .ackpt = s->ackpt, .offload = s->offload, .docs = plan_docs_of(s)};
  in->m.n_kv_head = nkv;
  d->canonical(&in->m);
  return FSDP_OK;
}

void plan_add_tensor(plan_unit *u, const char *name, int gid, int64_t d0, int64_t d1) {
  plan_tensor *t = &u->t[u->ntensors++];
  snprintf(t->name, sizeof t->name, "%s", name);
  t->gid = gid;
  t->ndim = d1 ? 2 : 1;
  t->shape[0] = d0;
  t->shape[1] = d1;
  t->numel = d1 ? d0 * d1 : d0;
  t->offset = u->numel;
  t->decay = t->ndim == 2;
  u->numel += t->numel;
}

void plan_add_part(plan_unit *u, const char *name, int gid, int64_t d0, int64_t d1, int64_t hf_rows, int64_t row0) {
  plan_add_tensor(u, name, gid, d0, d1);
  plan_tensor *t = &u->t[u->ntensors - 1];
  t->hf_rows = hf_rows;
  t->hf_row0 = row0;
}

fsdp_status plan_build(const jobspec_t *spec, int world, plan_t **out) {
  if (!spec || !out) return fsdp_set_error(FSDP_ERR_INVALID, "plan_build: NULL spec or output");
  *out = NULL;
  model_in in;
  TRY(model_in_from_spec(spec, world, &in));
  plan_t *p = calloc(1, sizeof *p);
  if (!p) return fsdp_set_error(FSDP_ERR_NOMEM, "no memory for the plan");
  const model_config *m = &in.m;
  int64_t C = m->n_embd, L = m->n_layer;
  p->model = *m;
  snprintf(p->source, sizeof p->source, "%s", spec->from);
  p->world = in.world;
  p->shard_world = in.group;
  p->ngroups = in.world / in.group;
  p->sharding = in.sharding;
  p->prefetch = in.prefetch;
  p->param_dtype = in.param_dtype;
  p->reduce_dtype = in.reduce_dtype;
  p->device = in.device;
  p->ackpt = in.ackpt;
  p->offload = in.offload;
  p->batch_size = in.batch_size;
  p->grad_accum = in.grad_accum;
  p->docs = in.docs;
  p->nunits = 1 + m->n_layer;
  p->units = calloc((size_t)p->nunits, sizeof *p->units);
  if (!p->units) {
    free(p);
    return fsdp_set_error(FSDP_ERR_NOMEM, "no memory for %d plan units", 1 + m->n_layer);
  }

  const arch_desc *d = arch_of(m);
  d->units(p);
  int64_t align = (int64_t)p->shard_world * PLAN_PAD_ALIGN;
  for (int k = 0; k < p->nunits; k++) {
    plan_unit *u = &p->units[k];
    u->padded = round_up(u->numel, align);
    u->shard_numel = u->padded / p->shard_world;
    u->shard_base = p->shard_total;
    p->shard_total += u->shard_numel;
  }

  /* the lookups that are no matmul (GPT-2's wpe, an untied Llama's embed_tokens; a tied head's
   * embedding is the head's matmul), and every embedding tensor, counted once */
  p->n_params = d->root_numel(m) + L * d->block_numel(m);
  p->n_params_no_emb = p->n_params - d->embed_numel(m);
  /* 6 per parameter for every matmul weight the token passes through; plus the attention scores
   * and weighted sum, 12·L·C·T (PaLM, appendix B), a windowed layer's at its share of the scores. */
  double attn = d->attn_dim ? (double)d->attn_dim(m) : (double)C;   /* queries' width: C, or NH·HD */
  double layers = 0;   /* Σ over layers of the share of causal attention's scores each computes */
  for (int l = 0; l < L; l++) layers += window_share(d->attn_window ? d->attn_window(m, l) : 0, m->seq_len);
  p->flops_per_token = 6.0 * (double)(p->n_params - d->lookup_numel(m)) + 12.0 * layers * attn * (double)m->seq_len;
  p->vocab_padded = plan_vocab_padded(in.device, m->vocab_size);
  p->pad_flops_per_token = 6.0 * (double)(p->vocab_padded - m->vocab_size) * (double)C;
  p->n_decay = (int)d->n_decay(m);
  p->act = d->act(m, in.batch_size, in.device, in.ackpt);
  model_memory(&in, p->mem, &p->mem_total, &p->host_bytes);
  /* [checkpoint] async: the shards' snapshot (parameters, AdamW m and v) waits in host memory */
  if (spec->ckpt_async && spec->ckpt_every > 0) p->snapshot_bytes = 3 * sizeof(float) * (uint64_t)p->shard_total;
  p->host_bytes += p->snapshot_bytes;
  model_comm(&in, in.sharding, p->sent_bytes, p->sent_inter);
  fsdp_status rc = plan_lora_build(spec, p);
  if (rc != FSDP_OK) {
    plan_destroy(&p);
    return rc;
  }
  plan_lora_memory(p);
  *out = p;
  return FSDP_OK;
}

void plan_destroy(plan_t **pp) {
  if (!pp || !*pp) return;
  free((*pp)->units);
  free(*pp);
  *pp = NULL;
}

const plan_tensor *plan_find_tensor(const plan_t *p, const char *name, int *unit) {
  if (!p || !name) return NULL;
  return arch_of(&p->model)->find(p, name, unit);
}

int plan_head_slot(const plan_t *p) { return arch_of(&p->model)->head_slot(&p->model); }

/* docs: plan_docs_of(spec), or the plan's where the spec is rebuilt from one (plan_min_world_of) */
static int min_world(const jobspec_t *spec, uint64_t device_bytes, int max_world, int docs) {
  if (max_world > PLAN_MAX_WORLD) max_world = PLAN_MAX_WORLD;
  for (int w = 1; w <= max_world; w++) {
    model_in in;
    if (spec->sharding == SHARD_HYBRID && (spec->shard_group < 1 || w % spec->shard_group || w == spec->shard_group))
      continue;   /* hybrid worlds are multiples of G; the memory is G's at every one */
    if (model_in_from_spec(spec, w, &in) != FSDP_OK) return 0;
    in.docs = docs;
    uint64_t mem[MEM_NCAT], total;
    model_memory(&in, mem, &total, NULL);
    if (total <= device_bytes) return w;
  }
  return 0;
}

int plan_min_world(const jobspec_t *spec, uint64_t device_bytes, int max_world) {
  return spec ? min_world(spec, device_bytes, max_world, plan_docs_of(spec)) : 0;
}

static model_in in_from_plan(const plan_t *p) {
  return (model_in){.m = p->model, .world = p->world, .group = p->shard_world, .batch_size = p->batch_size, .grad_accum = p->grad_accum,
                    .prefetch = p->prefetch, .sharding = p->sharding,
                    .param_dtype = p->param_dtype, .reduce_dtype = p->reduce_dtype, .device = p->device,
                    .ackpt = p->ackpt, .offload = p->offload, .docs = p->docs};
}

int plan_min_world_of(const plan_t *p, uint64_t device_bytes) {
  jobspec_t s;
  jobspec_defaults(&s);
  s.model = p->model;
  s.batch_size = p->batch_size;
  s.grad_accum = p->grad_accum;
  s.prefetch = p->prefetch;
  s.sharding = p->sharding;
  s.shard_group = p->sharding == SHARD_HYBRID ? p->shard_world : 0;
  s.param_dtype = p->param_dtype;
  s.reduce_dtype = p->reduce_dtype;
  s.device = p->device;
  s.ackpt = p->ackpt;
  s.offload = p->offload;
  return min_world(&s, device_bytes, PLAN_MAX_WORLD, p->docs);
}

void plan_sent_bytes_if(const plan_t *p, shard_mode mode, uint64_t sent[COLL_NKIND]) {
  model_in in = in_from_plan(p);
  model_comm(&in, mode, sent, NULL);
  plan_lora_sent(p, mode, sent);
}
