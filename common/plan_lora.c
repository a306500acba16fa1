/* plan_lora — LoRA's part of the plan: which projections carry adapters, where each adapter sits in
 * the adapters' segment, and what they add to the memory and communication model; see plan.h's
 * plan_lora and docs/memory.md "LoRA". Pure functions of the spec and the plan being built. */
#include "plan_priv.h"

#include "arch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether target NAME names module PATH: the whole path or its last parts ("c_proj" names
 * attn.c_proj and mlp.c_proj, "mlp.c_proj" only the latter), as peft matches target_modules. */
static int names_module(const char *path, const char *name, size_t n) {
  size_t pl = strlen(path);
  if (n > pl) return 0;
  if (strncmp(path + pl - n, name, n)) return 0;
  return n == pl || path[pl - n - 1] == '.';
}

/* "c_attn, c_proj, c_fc": every module's last part, each once. */
static void allowed_names(const arch_lora_module *mods, int n, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int i = 0; i < n && used < cap; i++) {
    const char *last = strrchr(mods[i].path, '.');
    last = last ? last + 1 : mods[i].path;
    int seen = 0;
    for (int j = 0; j < i; j++) {
      const char *lj = strrchr(mods[j].path, '.');
      seen |= !strcmp(lj ? lj + 1 : mods[j].path, last);
    }
    if (!seen) used += (size_t)snprintf(buf + used, cap - used, "%s%s", used ? ", " : "", last);
  }
}

/* The modules SPEC's targets name, as a mask over MODS. */
static fsdp_status target_mask(const jobspec_t *spec, const arch_desc *d, const arch_lora_module *mods, int n,
                               unsigned *mask) {
  const char *t = spec->lora.targets[0] ? spec->lora.targets : d->lora_default;
  char allowed[256];
  allowed_names(mods, n, allowed, sizeof allowed);
  *mask = 0;
  while (t && *t) {
    size_t skip = strspn(t, ", \t"), len;
    t += skip;
    if (!*t) break;
    len = strcspn(t, ", \t");
    unsigned hit = 0;
    for (int i = 0; i < n; i++)
      if (names_module(mods[i].path, t, len)) hit |= 1u << i;
    if (!hit)
      return fsdp_set_error(FSDP_ERR_INVALID, "[lora] targets: '%.*s' is no module of a %s block; allowed: %s "
                            "(comma-separated)", (int)len, t, d->name, allowed);
    *mask |= hit;
    t += len;
  }
  if (*mask) return FSDP_OK;
  if (!d->lora_default)   /* peft has no default for the family (Phi-3): it raises, so fsdpd refuses */
    return fsdp_set_error(FSDP_ERR_INVALID, "[lora] targets is required with arch = %s (peft has no default "
                          "targets for it); allowed: %s (comma-separated)", d->name, allowed);
  return fsdp_set_error(FSDP_ERR_INVALID, "[lora] targets is empty; allowed: module names, or leave it out for "
                        "peft's default (%s)", d->lora_default);
}

/* [lora] base_dtype = nf4: every 2-D tensor of a block quantized, its rows a whole number of blocks
 * of 64 (refused in one line otherwise); the largest block's image in bytes (worker/nf4_base.h),
 * padded and sharded. */
static fsdp_status nf4_layout(plan_t *p) {
  plan_lora *l = &p->lora;
  int64_t bytes = 0;
  for (int k = 1; k < p->nunits; k++) {
    const plan_unit *u = &p->units[k];
    int64_t b = 0;
    for (int i = 0; i < u->ntensors; i++) {
      const plan_tensor *t = &u->t[i];
      if (t->ndim == 1) {
        b += 2 * t->numel;
        continue;
      }
      if (t->shape[1] % PLAN_PAD_ALIGN)
        return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "[lora] base_dtype = nf4: %s is [%lld, %lld]; NF4 quantizes "
                              "blocks of 64 along its rows, so its row width must be a multiple of 64; allowed: a "
                              "model whose widths are multiples of 64, or base_dtype = bf16", t->name,
                              (long long)t->shape[0], (long long)t->shape[1]);
      int64_t nb = t->numel / 64, ng = (nb + 255) / 256;   /* nf4.h's nf4_bytes */
      b += t->numel / 2 + nb + 4 * ng + 4;
    }
    if (b > bytes) bytes = b;
  }
  int64_t align = (int64_t)p->shard_world * PLAN_PAD_ALIGN;
  l->nf4 = 1;
  l->nf4_block = bytes;
  l->nf4_padded = (bytes + align - 1) / align * align;
  l->nf4_shard = l->nf4_padded / p->shard_world;
  return FSDP_OK;
}

fsdp_status plan_lora_build(const jobspec_t *spec, plan_t *p) {
  plan_lora *l = &p->lora;
  memset(l, 0, sizeof *l);
  if (spec->lora.rank <= 0) return FSDP_OK;
  const arch_desc *d = arch_get(p->model.arch);
  if (!d->lora_modules) {
    char allowed[128] = "";
    size_t used = 0;
    for (int a = 0; a < arch_count() && used < sizeof allowed; a++)
      if (arch_get((model_arch)a)->lora_modules)
        used += (size_t)snprintf(allowed + used, sizeof allowed - used, "%s%s", used ? ", " : "", arch_get((model_arch)a)->name);
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "[lora] on arch = %s is not computed yet; allowed: an architecture "
                          "whose projections fsdpd adapts (%s)", d->name, allowed);
  }
  arch_lora_module mods[ARCH_LORA_MAX];
  int n = d->lora_modules(&p->model, mods);
  unsigned mask;
  TRY(target_mask(spec, d, mods, n, &mask));
  int64_t r = spec->lora.rank, off = 0;
  l->rank = spec->lora.rank;
  l->alpha = spec->lora.alpha;
  l->scale = (float)(spec->lora.alpha / (double)spec->lora.rank);
  for (int i = 0; i < n; i++) {
    if (!(mask & (1u << i))) continue;
    const arch_lora_module *m = &mods[i];
    int64_t width = m->in < m->out ? m->in : m->out;
    if (r > width)
      return fsdp_set_error(FSDP_ERR_RANGE, "[lora] rank = %lld is above the width of %s (in %lld, out %lld); "
                            "allowed: 1..%lld", (long long)r, m->path, (long long)m->in, (long long)m->out,
                            (long long)width);
    plan_lora_mod *pm = &l->mod[l->nmods++];
    snprintf(pm->path, sizeof pm->path, "%s", m->path);
    pm->slot = m->slot;
    pm->in = m->in, pm->out = m->out, pm->col0 = m->col0, pm->ld = m->ld;
    pm->a_off = off;
    off += r * m->in;
    pm->b_off = off;
    off += m->out * r;
  }
  l->block_numel = off;
  l->numel = (int64_t)p->model.n_layer * off;
  int64_t BT = (int64_t)p->batch_size * p->model.seq_len;
  l->saved = (p->ackpt == ACKPT_FULL ? 1 : (int64_t)p->model.n_layer) * l->nmods * BT * r;
  l->ws = BT * r;   /* s·dy·B: the products read and accumulate in place (lora.c) */
  /* a job's sharded with sharding none is refused by jobspec's rules; a plan derived from it without
   * sharding (one rank's view of the whole model) holds them whole */
  l->sharded = spec->lora.adapters == ADAPTERS_REPLICATED || p->sharding == SHARD_NONE ? 0
               : spec->lora.adapters == ADAPTERS_SHARDED                              ? 1 : -1;
  return spec->lora.base_dtype == BASE_NF4 ? nf4_layout(p) : FSDP_OK;
}

/* The ranks a sharded unit is spread over in sharding MODE. */
static int shard_ranks(const plan_t *p, shard_mode mode) {
  return mode == SHARD_NONE ? 1 : mode == SHARD_HYBRID ? p->shard_world : p->world;
}

void plan_root_part(const plan_t *p, int part, int64_t *lo, int64_t *hi) {
  const plan_unit *r = &p->units[0];
  int64_t x = r->numel;   /* the first 1-D tensor (the final norm): the lookup's tensors end there */
  for (int i = 0; i < r->ntensors; i++)
    if (r->t[i].ndim == 1 && r->t[i].offset < x) x = r->t[i].offset;
  if (part == 0) {
    *lo = 0, *hi = x;
    return;
  }
  *lo = r->t[plan_head_slot(p)].offset < x ? 0 : x;   /* tied: the head reads the embedding */
  *hi = r->numel;
}

int64_t plan_root_part_max(const plan_t *p) {
  int64_t lo0, hi0, lo1, hi1;
  plan_root_part(p, 0, &lo0, &hi0);
  plan_root_part(p, 1, &lo1, &hi1);
  return hi0 - lo0 > hi1 - lo1 ? hi0 - lo0 : hi1 - lo1;
}

/* Bytes one rank sends per step in sharding MODE all-reducing the frozen root's two parts (each
 * rounded down, as the comm counts it) in pb-byte elements; none: 0. */
static uint64_t root_parts_sent(const plan_t *p, shard_mode mode, uint64_t pb) {
  if (mode == SHARD_NONE) return 0;
  uint64_t W = (uint64_t)shard_ranks(p, mode), G = (uint64_t)p->grad_accum, sent = 0;
  for (int part = 0; part < 2; part++) {
    int64_t lo, hi;
    plan_root_part(p, part, &lo, &hi);
    sent += 2 * (W - 1) * pb * (uint64_t)(hi - lo) / W;
  }
  return G * sent;
}

/* Bytes one rank sends gathering an NF4 base's blocks per step in sharding MODE: every block's NF4
 * bytes once (grad_op) or twice (full, hybrid) per micro-step; none gathers nothing (the bf16 root
 * is all-reduced in parts: root_parts_sent). */
static uint64_t nf4_allgather(const plan_t *p, shard_mode mode) {
  if (mode == SHARD_NONE) return 0;
  uint64_t W = (uint64_t)shard_ranks(p, mode), G = (uint64_t)p->grad_accum;
  uint64_t L = (uint64_t)p->model.n_layer, align = W * PLAN_PAD_ALIGN;
  uint64_t Sb = ((uint64_t)p->lora.nf4_block + align - 1) / align * align / W;
  return G * (W - 1) * (mode == SHARD_GRAD_OP ? 1 : 2) * L * Sb;
}

/* NF4's base: a bf16 root shard and the blocks' NF4 shards; the gathered root, NF4 slots, the
 * dequantized bf16 working unit and (CPU) the fp32 compute copies; (CUDA) the dequantization maps. */
static void nf4_memory(plan_t *p) {
  const plan_lora *l = &p->lora;
  uint64_t L = (uint64_t)p->model.n_layer, pf = (uint64_t)p->prefetch;
  uint64_t Pr = (uint64_t)p->units[0].padded, Sr = (uint64_t)p->units[0].shard_numel, Pb = 0;
  for (int k = 1; k < p->nunits; k++)
    if ((uint64_t)p->units[k].padded > Pb) Pb = (uint64_t)p->units[k].padded;
  uint64_t cpu = p->device == DEVICE_CPU, slots;
  switch (p->sharding) {
  case SHARD_GRAD_OP: slots = L; break;
  case SHARD_NONE: slots = 0; break;
  default: slots = 1 + pf < L ? 1 + pf : L; break;
  }
  p->mem[MEM_PARAM_SHARD] = 2 * Sr + L * (uint64_t)l->nf4_shard;   /* the adapters' are added after */
  uint64_t R = p->sharding == SHARD_NONE ? Pr : (uint64_t)plan_root_part_max(p);   /* the root, gathered in parts */
  p->mem[MEM_GATHERED] = (p->sharding == SHARD_NONE ? 0 : 2 * R + slots * (uint64_t)l->nf4_padded) + 2 * Pb +
                         (cpu ? 4 * (R + Pb) : 0);
  if (!cpu) p->mem[MEM_WORKSPACE] += PLAN_NF4_MAPS_BYTES;
}

/* The dequantized working unit's bytes (NF4: 2·Pb), for the plan's split; 0 without NF4. */
uint64_t plan_lora_dequant_bytes(const plan_t *p) {
  if (!p->lora.nf4) return 0;
  uint64_t Pb = 0;
  for (int k = 1; k < p->nunits; k++)
    if ((uint64_t)p->units[k].padded > Pb) Pb = (uint64_t)p->units[k].padded;
  return 2 * Pb;
}

int64_t plan_lora_padded(const plan_t *p, int W) {
  int64_t n = p->lora.block_numel, align = (int64_t)W * PLAN_PAD_ALIGN;
  return W <= 1 ? n : (n + align - 1) / align * align;
}

/* The adapters' own bytes per rank, by category (MEM), in host memory (*HOST) and the checkpoint
 * snapshot's (*SNAP), held SHARDED or replicated (plan.h's plan_lora). Their n held elements: fp32
 * master 4·n and the compute form (CUDA: + 2·n bf16), gradient 4·n, AdamW 8·n; offload = optimizer
 * moves the master and AdamW state to the host beside a staging copy of the gradient (16·n there)
 * and leaves the device the compute form alone, e·n (the CPU: an fp32 copy). */
static void adapter_memory(const plan_t *p, int sharded, uint64_t mem[MEM_NCAT], uint64_t *host, uint64_t *snap) {
  uint64_t e = p->device == DEVICE_CPU ? 4 : 2, L = (uint64_t)p->model.n_layer, n = (uint64_t)p->lora.numel;
  memset(mem, 0, MEM_NCAT * sizeof *mem);
  if (sharded) {
    uint64_t W = (uint64_t)p->shard_world, Pa = (uint64_t)plan_lora_padded(p, (int)W), Sa = Pa / W;
    uint64_t pf = (uint64_t)p->prefetch, slots = p->sharding == SHARD_GRAD_OP ? L : (1 + pf < L ? 1 + pf : L);
    uint64_t scratch = W > 1 ? Sa : 0;   /* the ring reduce-scatter's receive scratch (comm_gloo.cc) */
    n = L * Sa;   /* SA */
    mem[MEM_GATHERED] = e * slots * Pa;
    /* the reducer's buffers for units of Pa (reduce.h; the empty root holds none) */
    mem[MEM_COMM] = p->reduce_dtype == DTYPE_FP32 ? 4 * (2 * Pa + scratch) : 4 * Pa + 2 * (2 * Pa) + 2 * (2 * Sa + scratch);
    if (p->reduce_dtype == DTYPE_BF16 && p->sharding == SHARD_HYBRID) mem[MEM_COMM] += 2 * n;
  }
  int off = p->offload == OFFLOAD_OPTIMIZER;
  mem[MEM_PARAM_SHARD] = off ? e * n : 4 * n + (e == 2 ? 2 * n : 0);
  mem[MEM_GRAD_SHARD] = 4 * n;
  mem[MEM_OPTIM_STATE] = off ? 0 : 8 * n;
  *host = off ? 16 * n : 0;
  *snap = 12 * n;
}

void plan_lora_adapter_memory(const plan_t *p, uint64_t mem[MEM_NCAT], uint64_t *host) {
  uint64_t snap;
  adapter_memory(p, p->lora.sharded == 1, mem, host, &snap);
}

static uint64_t total_of(const uint64_t mem[MEM_NCAT]) {
  uint64_t t = 0;
  for (int c = 0; c < MEM_NCAT; c++) t += mem[c];
  return t;
}

void plan_lora_memory(plan_t *p) {
  plan_lora *l = &p->lora;
  if (!l->rank) return;
  uint64_t e = p->device == DEVICE_CPU ? 4 : 2;
  /* the frozen base is one shard in its own dtype (no fp32 master beside a bf16 copy) */
  uint64_t S = (uint64_t)p->shard_total, pb = (uint64_t)jobspec_dtype_bytes(p->param_dtype);
  p->mem[MEM_PARAM_SHARD] = pb * S;
  if (l->nf4) {
    nf4_memory(p);
  } else if (p->sharding != SHARD_NONE) {   /* the frozen root is gathered in parts, into one buffer of the larger */
    uint64_t Pr = (uint64_t)p->units[0].padded, R = (uint64_t)plan_root_part_max(p);
    p->mem[MEM_GATHERED] -= pb * Pr - pb * R;
    if (pb != e) p->mem[MEM_GATHERED] -= e * Pr - e * R;   /* and its compute-form copy */
  }
  p->mem[MEM_GRAD_SHARD] = 0;
  p->mem[MEM_OPTIM_STATE] = 0;
  p->mem[MEM_COMM] = 4 * PLAN_STEP_SCALARS;
  p->mem[MEM_ACTIVATIONS] += e * (uint64_t)l->saved;
  p->mem[MEM_WORKSPACE] += e * (uint64_t)l->ws;
  if (p->device != DEVICE_CPU) p->mem[MEM_WORKSPACE] += 16 * (uint64_t)p->model.n_layer;   /* CUDA: AdamW's decay table */
  /* auto: sharded where it holds less per rank (ties: replicated, which sends less) */
  uint64_t rep[MEM_NCAT], shd[MEM_NCAT], rhost, shost, rsnap, ssnap;
  adapter_memory(p, 0, rep, &rhost, &rsnap);
  adapter_memory(p, 1, shd, &shost, &ssnap);
  if (l->sharded < 0) l->sharded = p->sharding != SHARD_NONE && total_of(shd) < total_of(rep);
  l->a_padded = l->sharded ? plan_lora_padded(p, p->shard_world) : l->block_numel;
  l->a_shard = l->sharded ? l->a_padded / p->shard_world : l->block_numel;
  for (int c = 0; c < MEM_NCAT; c++) p->mem[c] += l->sharded ? shd[c] : rep[c];
  p->mem_total = total_of(p->mem);
  /* host memory: the adapters' offloaded state (the frozen base has none to offload) and, with
   * [checkpoint] async, a writer's snapshot of the adapters and their AdamW state only */
  if (p->snapshot_bytes) p->snapshot_bytes = l->sharded ? ssnap : rsnap;
  p->host_bytes = (l->sharded ? shost : rhost) + p->snapshot_bytes;
  plan_lora_sent(p, p->sharding, p->sent_bytes);
  if (p->sharding == SHARD_HYBRID) {   /* across the groups: the step's scalars and the adapters' all-reduces */
    p->sent_inter[COLL_REDUCESCATTER] = 0;
    p->sent_inter[COLL_ALLREDUCE] = p->sent_bytes[COLL_ALLREDUCE] - root_parts_sent(p, p->sharding, pb);
  }
  /* the frozen weights: forward and input gradient (4 per weight), no weight gradient; the adapters
   * 6 per element (their A·x and B·h, forward and backward) */
  const arch_desc *d = arch_get(p->model.arch);
  int64_t C = p->model.n_embd, L = p->model.n_layer, T = p->model.seq_len;
  p->flops_per_token = 4.0 * (double)(p->n_params - d->lookup_numel(&p->model)) + 6.0 * (double)l->numel +
                       12.0 * (double)L * (double)C * (double)T;
}

void plan_lora_sent(const plan_t *p, shard_mode mode, uint64_t sent[COLL_NKIND]) {
  if (!p->lora.rank) return;
  uint64_t N = (uint64_t)p->world, NA = (uint64_t)p->lora.numel, G = (uint64_t)p->grad_accum;
  uint64_t scalars = 2 * (N - 1) * 4 * PLAN_STEP_SCALARS / N;   /* each all-reduce rounded down, as the comm counts it */
  sent[COLL_REDUCESCATTER] = 0;   /* the frozen base is not reduced */
  /* the root is not all-gathered but all-reduced in two parts (each rank adds its shard's part to
   * zeros: plan_root_part), in its dtype (NF4: bf16) */
  uint64_t W = (uint64_t)shard_ranks(p, mode), pb = p->lora.nf4 ? 2 : (uint64_t)jobspec_dtype_bytes(p->param_dtype);
  uint64_t align = W * PLAN_PAD_ALIGN, Sr = ((uint64_t)p->units[0].numel + align - 1) / align * align / W;
  uint64_t roots = root_parts_sent(p, mode, pb);
  if (p->lora.nf4) sent[COLL_ALLGATHER] = nf4_allgather(p, mode);
  else if (mode != SHARD_NONE) sent[COLL_ALLGATHER] -= G * pb * (W - 1) * Sr;
  if (!p->lora.sharded || mode == SHARD_NONE) {   /* the gradient all-reduced over the world once per step */
    sent[COLL_ALLREDUCE] = scalars + 2 * (N - 1) * 4 * NA / N + roots;
    return;
  }
  /* sharded: gathered with each block's base gather, reduce-scattered after each block's backward,
   * hybrid: each final shard all-reduced across the R groups, one all-reduce per block */
  uint64_t L = (uint64_t)p->model.n_layer;
  uint64_t Sa = (uint64_t)plan_lora_padded(p, (int)W) / W, e = p->device == DEVICE_CPU ? 4 : 2;
  uint64_t rb = (uint64_t)jobspec_dtype_bytes(p->reduce_dtype), R = N / W;
  sent[COLL_ALLGATHER] += G * (W - 1) * e * L * Sa * (mode == SHARD_GRAD_OP ? 1 : 2);
  sent[COLL_REDUCESCATTER] = G * (W - 1) * rb * L * Sa;
  sent[COLL_ALLREDUCE] = scalars + (mode == SHARD_HYBRID ? L * (2 * (R - 1) * rb * Sa / R) : 0) + roots;
}

/* A plan of L units (plus an empty root first when ROOT) of one decayed 2-D tensor of the adapters
 * each, padded and sharded for W ranks. */
static fsdp_status segment_plan(const plan_t *p, int W, int root, plan_t **out) {
  *out = NULL;
  int L = p->model.n_layer, nu = L + root;
  plan_t *o = calloc(1, sizeof *o);
  plan_unit *units = o ? calloc((size_t)nu, sizeof *units) : NULL;
  if (!units) {
    free(o);
    return fsdp_set_error(FSDP_ERR_NOMEM, "cannot allocate the adapters' plan");
  }
  int64_t Pa = plan_lora_padded(p, W), Sa = Pa / W;
  *o = (plan_t){.model = p->model, .world = W, .shard_world = W, .ngroups = 1,
                .sharding = W > 1 ? SHARD_FULL : SHARD_NONE, .device = p->device, .batch_size = p->batch_size,
                .grad_accum = p->grad_accum, .nunits = nu, .units = units, .shard_total = (int64_t)L * Sa,
                .n_params = p->lora.numel, .lora = p->lora};
  snprintf(o->source, sizeof o->source, "%s", p->source);
  if (root) snprintf(units[0].name, sizeof units[0].name, "lora.root");
  for (int u = 0; u < L; u++) {
    plan_unit *pu = &units[u + root];
    snprintf(pu->name, sizeof pu->name, "lora.%d", u);
    pu->ntensors = 1;
    pu->t[0] = (plan_tensor){.ndim = 2, .numel = p->lora.block_numel, .shape = {1, p->lora.block_numel}, .decay = 1};
    pu->numel = p->lora.block_numel;
    pu->padded = Pa;
    pu->shard_numel = Sa;
    pu->shard_base = (int64_t)u * Sa;
  }
  *out = o;
  return FSDP_OK;
}

fsdp_status plan_lora_segment(const plan_t *p, int W, plan_t **out) { return segment_plan(p, W < 1 ? 1 : W, 0, out); }

fsdp_status plan_lora_units(const plan_t *p, plan_t **out) {
  TRY(segment_plan(p, p->shard_world, 1, out));
  plan_t *o = *out;
  o->world = p->world, o->ngroups = p->ngroups, o->sharding = p->sharding, o->prefetch = p->prefetch;
  o->param_dtype = p->device == DEVICE_CPU ? DTYPE_FP32 : DTYPE_BF16;
  o->reduce_dtype = p->reduce_dtype;
  o->ackpt = p->ackpt;
  o->lora = (plan_lora){0};   /* units of trained tensors: nothing of them is frozen */
  return FSDP_OK;
}

void plan_lora_scatter(const plan_t *p, int W, int q, const float *shard, float *whole) {
  int64_t n = p->lora.block_numel, Sa = plan_lora_padded(p, W) / (W < 1 ? 1 : W);
  for (int u = 0; u < p->model.n_layer; u++)
    for (int64_t i = 0; i < Sa && (int64_t)q * Sa + i < n; i++)
      whole[(int64_t)u * n + (int64_t)q * Sa + i] = shard[(int64_t)u * Sa + i];
}

void plan_lora_pick(const plan_t *p, int W, int q, const float *whole, float *shard) {
  int64_t n = p->lora.block_numel, Sa = plan_lora_padded(p, W) / (W < 1 ? 1 : W);
  for (int u = 0; u < p->model.n_layer; u++)
    for (int64_t i = 0; i < Sa; i++) {
      int64_t k = (int64_t)q * Sa + i;
      shard[(int64_t)u * Sa + i] = k < n ? whole[(int64_t)u * n + k] : 0.0f;
    }
}

const plan_lora_mod *plan_lora_of(const plan_t *p, int slot) {
  for (int i = 0; i < p->lora.nmods; i++)
    if (p->lora.mod[i].slot == slot) return &p->lora.mod[i];
  return NULL;
}

void plan_lora_name(const plan_t *p, int layer, int m, int b, char *buf, size_t n) {
  const arch_desc *d = arch_get(p->model.arch);
  char blk[64];
  snprintf(blk, sizeof blk, d->lora_block_hf, layer);
  snprintf(buf, n, "base_model.model.%s%s.lora_%c.weight", blk, p->lora.mod[m].path, b ? 'B' : 'A');
}
