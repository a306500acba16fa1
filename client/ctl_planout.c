/* ctl_planout — what `fsdpctl plan` shows of a plan (common/plan.h): the human table and the
 * same figures as JSON (`--json`, docs/memory.md). Presentation only: every figure comes from
 * the plan or from plan.h's functions; the daemon and the workers never print plans. */
#include "ctl_planout.h"

#include "arch.h"

#include <inttypes.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define PLAN_MAX_WORLD 4096   /* jobspec's [fsdp] world_size range */

/* ---- the human table ---- */

/* LABEL left-aligned in WIDTH columns, counting UTF-8 code points (Ψ is two bytes, one column). */
static void put_label(FILE *f, const char *label, int width) {
  int cols = 0;
  for (const unsigned char *c = (const unsigned char *)label; *c; c++) cols += (*c & 0xC0) != 0x80;
  fprintf(f, "  %s%*s", label, width > cols ? width - cols : 0, "");
}

static const char *human_bytes(uint64_t b, char *buf, size_t n) {
  if (b < 1024) snprintf(buf, n, "%" PRIu64 " B", b);
  else if (b < 1024 * 1024) snprintf(buf, n, "%.1f KiB", (double)b / 1024);
  else if (b < 1024ull * 1024 * 1024) snprintf(buf, n, "%.1f MiB", (double)b / (1024.0 * 1024));
  else snprintf(buf, n, "%.1f GiB", (double)b / (1024.0 * 1024 * 1024));
  return buf;
}

static const char *human_count(int64_t v, char *buf, size_t n) {
  char raw[32];
  snprintf(raw, sizeof raw, "%" PRId64, v < 0 ? -v : v);
  size_t len = strlen(raw), o = 0;
  if (v < 0 && o + 1 < n) buf[o++] = '-';
  for (size_t i = 0; i < len && o + 2 < n; i++) {
    if (i && (len - i) % 3 == 0) buf[o++] = ',';
    buf[o++] = raw[i];
  }
  buf[o] = '\0';
  return buf;
}

/* "[C, C]"; a part of a fused tensor its rows: "[0:C, C]" */
static const char *shape_str(const plan_tensor *t, char *buf, size_t n) {
  if (t->hf_rows)
    snprintf(buf, n, "[%" PRId64 ":%" PRId64 ", %" PRId64 "]", t->hf_row0, t->hf_row0 + t->shape[0], t->shape[1]);
  else if (t->ndim == 2) snprintf(buf, n, "[%" PRId64 ", %" PRId64 "]", t->shape[0], t->shape[1]);
  else snprintf(buf, n, "[%" PRId64 "]", t->shape[0]);
  return buf;
}

/* [lora]'s own terms (plan.h's plan_lora), written into BUF, or NULL where the category's formula is
 * the full fine-tune's. One form for both placements of the adapters: A is what a rank holds of
 * them, NA (every adapter, whole on every rank) or, sharded, SA = L·Sa (its part of every block's);
 * sharded adapters are also gathered per block (e·slots·Pa) and reduce-scattered. */
static const char *lora_formula(const plan_t *p, int c, char *buf, size_t n) {
  int bf = p->param_dtype == DTYPE_BF16, cuda = p->device != DEVICE_CPU, sh = p->lora.sharded;
  const char *A = sh ? "SA" : "NA", *held = sh ? "fp32 adapter shards" : "fp32 adapters (whole on every rank)";
  /* offload = optimizer: the adapters' master and AdamW state are on the host (the host line) */
  if (p->offload == OFFLOAD_OPTIMIZER && c == MEM_OPTIM_STATE)
    return "0: the adapters' AdamW m and v are on the host (the base has none)";
  if (p->offload == OFFLOAD_OPTIMIZER && c == MEM_PARAM_SHARD) {
    if (p->lora.nf4)
      snprintf(buf, n, "2·Sr + L·nf4_shard + e·%s: bf16 root, NF4 blocks; the adapters' compute form (master on the "
               "host)", A);
    else
      snprintf(buf, n, "pb·S + e·%s: frozen base shard; the %s' compute form (their fp32 master is on the host)", A,
               sh ? "adapter shards" : "adapters");
    return buf;
  }
  switch (c) {
  case MEM_PARAM_SHARD:
    if (p->lora.nf4)
      snprintf(buf, n, "2·Sr + L·nf4_shard + 4·%s (+ 2·%s on CUDA): bf16 root, NF4 blocks; %s", A, A, held);
    else
      snprintf(buf, n, "%d·S + %d·%s: frozen base shard in %s; %s%s", bf ? 2 : 4, cuda ? 6 : 4, A,
               bf ? "bf16 (no master)" : "fp32", held, cuda ? " and their bf16 form" : "");
    return buf;
  case MEM_GRAD_SHARD:
    snprintf(buf, n, "4·%s: the adapters' gradient%s (the frozen base has none)", A, sh ? " shards" : "");
    return buf;
  case MEM_OPTIM_STATE:
    snprintf(buf, n, "8·%s: the adapters' AdamW m and v%s (none for the base)", A, sh ? " shards" : "");
    return buf;
  case MEM_COMM:
    if (!sh) return "16: the step's scalars (the base is not reduce-scattered; the adapters all-reduce in place)";
    return p->reduce_dtype == DTYPE_BF16 ? "8·Pa + 2·(3·Sa) (+ 2·SA hybrid) + 16: the adapters' bf16 reduce buffers, scalars"
                                         : "4·(2·Pa + Sa) + 16: the adapters' two block gradients, ring scratch, scalars";
  case MEM_GATHERED:
    if (p->sharding == SHARD_NONE && !sh)
      return p->lora.nf4 ? "2·Pb (+ 4·(Pr + Pb) on the CPU): the dequantized working unit" : NULL;
    if (p->lora.nf4)
      snprintf(buf, n, "2·R + slots·nf4_padded + 2·Pb (+ 4·(R + Pb) on the CPU)%s: the bf16 root's larger part, NF4 "
               "blocks, the dequantized working unit%s", sh ? " + e·slots·Pa" : "", sh ? ", the gathered adapters" : "");
    else
      snprintf(buf, n, "pb·(R + slots·Pb) (+ cb·(R + Pb))%s: the frozen root's larger part (gathered in parts), "
               "blocks%s", sh ? " + e·slots·Pa" : "", sh ? ", the gathered adapters" : "");
    return buf;
  default: return NULL;
  }
}

static const char *mem_formula(const plan_t *p, int c, char *buf, size_t n) {
  int off = p->offload == OFFLOAD_OPTIMIZER, bf = p->param_dtype == DTYPE_BF16;
  int conv = jobspec_dtype_bytes(p->param_dtype) != (p->device == DEVICE_CPU ? 4 : 2);
  const char *lf = p->lora.rank ? lora_formula(p, c, buf, n) : NULL;
  if (lf) return lf;
  switch (c) {
  case MEM_PARAM_SHARD:
    return off ? "pb·S: the form the gathers read (the fp32 master is on the host)"
           : bf ? "4·S + 2·S: fp32 master shard and its bf16 copy" : "fp32 master shard: 4·S";
  case MEM_GRAD_SHARD: return "fp32 gradient shard: 4·S";
  case MEM_OPTIM_STATE: return off ? "0: AdamW m and v are on the host" : "AdamW m and v: 8·S";
  case MEM_GATHERED:
    if (p->sharding == SHARD_FULL || p->sharding == SHARD_HYBRID)
      return conv ? "pb·(Pr + min(1+p, L)·Pb) + cb·(Pr + Pb): root + blocks + their compute-dtype copies"
                  : "pb·(Pr + min(1+p, L)·Pb): root + block computed + prefetched";
    if (p->sharding == SHARD_GRAD_OP)
      return conv ? "pb·Σ padded + cb·(Pr + Pb): every unit gathered forward→backward + compute copies"
                  : "pb·Σ padded: every unit gathered forward→backward";
    return conv ? "cb·(Pr + Pb): a root and a block in the compute dtype" : "0: the shard is the whole model";
  case MEM_ACTIVATIONS:
    if (p->device == DEVICE_CPU)
      return p->ackpt == ACKPT_FULL ? "4·(L·block_saved + block_ws + root_saved) + 8·B·T·G: checkpointed"
                                    : "4·(L·block_saved + root_saved) + 8·B·T·G";
    return p->ackpt == ACKPT_FULL ? "bf16 acts, fp32 stats: L·block_bytes + block_ws_bytes + root_bytes + 8·B·T·G"
                                  : "bf16 acts, fp32 stats: L·block_bytes + root_bytes + 8·B·T·G";
  case MEM_WORKSPACE:
    return p->device == DEVICE_CPU ? "4·max(head_ws, bwd_ws)" : "max(head_ws, bwd_ws) bytes + CUDA workspace";
  case MEM_COMM:
    if (p->sharding == SHARD_NONE)
      return p->reduce_dtype == DTYPE_BF16 ? "2·S + 16: the gradient in bf16 for the all-reduce, scalars"
                                           : "16: the step's scalars (gradients all-reduced in place)";
    if (p->sharding == SHARD_HYBRID)
      return p->reduce_dtype == DTYPE_BF16
                 ? "4·(Pr+Pb) + 2·(Pr+2Pb) + 2·(Sr+2Sb+Smax) + 2·S + 16: as full, + the bf16 shard all-reduced across groups"
                 : "4·(Pr + 2·Pb + Smax) + 16: as full (the shard is all-reduced across groups in place)";
    return p->reduce_dtype == DTYPE_BF16 ? "4·(Pr+Pb) + 2·(Pr+2Pb) + 2·(Sr+2Sb+Smax) + 16: fp32 grads, bf16 send/recv"
                                         : "4·(Pr + 2·Pb + Smax) + 16: unit gradients, ring scratch, scalars";
  }
  return "";
}

/* The tensor column's width: the architecture's longest names. */
static int name_width(const plan_t *p) { return arch_get(p->model.arch)->name_width; }

static void print_tensors(const plan_t *p, FILE *f, int u) {
  const plan_unit *pu = &p->units[u];
  char a[32], b[32], c[32];
  for (int j = 0; j < pu->ntensors; j++) {
    const plan_tensor *t = &pu->t[j];
    fprintf(f, "  %-8s %-*s %-13s %13s %13s  %s\n", pu->name, name_width(p), t->name, shape_str(t, a, sizeof a),
            human_count(t->numel, b, sizeof b), human_count(t->offset, c, sizeof c), t->decay ? "yes" : "no");
  }
}

static void print_shard_row(const plan_t *p, FILE *f, int r) {
  char a[32], b[32], c[32], d[32], e[32];
  const plan_unit *root = &p->units[0];
  fprintf(f, "  %5d %15s %13s", r, human_count(plan_shard_offset(p, 0, r), a, sizeof a),
          human_count(root->shard_numel, b, sizeof b));
  if (p->nunits > 1)
    fprintf(f, " %15s %13s", human_count(plan_shard_offset(p, 1, r), c, sizeof c),
            human_count(p->units[1].shard_numel, d, sizeof d));
  fprintf(f, " %15s\n", human_count(p->shard_total, e, sizeof e));
}

/* Hybrid: the step's bytes split into the traffic inside a shard group and the traffic between them. */
static void print_hybrid_traffic(const plan_t *p, FILE *f) {
  char a[32], b[32], c[32], e[32];
  uint64_t intra[COLL_NKIND], in_total = 0, x_total = 0;
  for (int k = 0; k < COLL_NKIND; k++) {
    intra[k] = p->sent_bytes[k] - p->sent_inter[k];
    in_total += intra[k];
    x_total += p->sent_inter[k];
  }
  fprintf(f, "  %-10s %12s %14s %12s %12s  inside a group of %d ranks (one node when placed so)\n", "intra", human_bytes(intra[0], a, sizeof a),
          human_bytes(intra[1], b, sizeof b), human_bytes(intra[2], c, sizeof c), human_bytes(in_total, e, sizeof e),
          p->shard_world);
  fprintf(f, "  %-10s %12s %14s %12s %12s  across the %d groups: each shard's gradient, and the step's scalars\n",
          "inter", human_bytes(p->sent_inter[0], a, sizeof a), human_bytes(p->sent_inter[1], b, sizeof b),
          human_bytes(p->sent_inter[2], c, sizeof c), human_bytes(x_total, e, sizeof e), p->ngroups);
}

/* [lora]: the adapters and the categories split into base and adapters. */
static void print_lora(const plan_t *p, FILE *f) {
  const plan_lora *l = &p->lora;
  char a[32], b[32], c[32], d[32], e[32], targets[256];
  size_t used = 0;
  targets[0] = '\0';
  for (int j = 0; j < l->nmods && used < sizeof targets; j++)
    used += (size_t)snprintf(targets + used, sizeof targets - used, "%s%s", j ? ", " : "", l->mod[j].path);
  uint64_t NA = (uint64_t)plan_lora_held(p), e_act = p->device == DEVICE_CPU ? 4 : 2, am[MEM_NCAT], ahost;
  plan_lora_adapter_memory(p, am, &ahost);
  uint64_t base = p->mem[MEM_PARAM_SHARD] - am[MEM_PARAM_SHARD];
  char basedt[96];
  if (l->nf4)
    snprintf(basedt, sizeof basedt, "root bf16 %s, blocks nf4 %s",
             human_bytes(2 * (uint64_t)p->units[0].shard_numel, a, sizeof a),
             human_bytes((uint64_t)(p->nunits - 1) * (uint64_t)l->nf4_shard, b, sizeof b));
  else
    snprintf(basedt, sizeof basedt, "%s", jobspec_dtype_kind_name(p->param_dtype));
  fprintf(f, "  LoRA: r = %d, alpha = %g (scale %g) on %s: NA = %s adapter elements (%s per block), fp32\n",
          l->rank, l->alpha, (double)l->scale, targets, human_count(l->numel, a, sizeof a),
          human_count(l->block_numel, b, sizeof b));
  if (l->sharded)
    fprintf(f, "    adapters sharded: each block's in a unit of its own (Pa = %s, Sa = %s per rank), gathered beside "
            "the block, reduce-scattered after its backward; SA = %s per rank\n", human_count(l->a_padded, a, sizeof a),
            human_count(l->a_shard, b, sizeof b), human_count((int64_t)NA, c, sizeof c));
  else
    fprintf(f, "    adapters replicated: whole on every rank, the gradient all-reduced once per step\n");
  if (ahost)
    fprintf(f, "    base (frozen, %s) %s; adapters %s (their compute form), their gradient %s; offload = optimizer: "
            "their fp32 master and AdamW state on the host, %s with the gradient's staging (AdamW runs there)\n",
            basedt, human_bytes(base, a, sizeof a), human_bytes(am[MEM_PARAM_SHARD], b, sizeof b),
            human_bytes(am[MEM_GRAD_SHARD], c, sizeof c), human_bytes(ahost, d, sizeof d));
  else
    fprintf(f, "    base (frozen, %s) %s; adapters %s, their gradient %s, their AdamW state %s\n",
            basedt, human_bytes(base, a, sizeof a), human_bytes(am[MEM_PARAM_SHARD], b, sizeof b),
            human_bytes(am[MEM_GRAD_SHARD], c, sizeof c), human_bytes(am[MEM_OPTIM_STATE], d, sizeof d));
  if (p->sharding != SHARD_NONE) {
    int64_t lo0, hi0, lo1, hi1;
    plan_root_part(p, 0, &lo0, &hi0);
    plan_root_part(p, 1, &lo1, &hi1);
    fprintf(f, "    frozen root gathered in parts: the lookup's %s elements, then the head's %s (R = %s; Pr = %s)\n",
            human_count(hi0 - lo0, a, sizeof a), human_count(hi1 - lo1, b, sizeof b),
            human_count(plan_root_part_max(p), c, sizeof c), human_count(p->units[0].padded, d, sizeof d));
  }
  fprintf(f, "    activations + %s (x·Aᵀ of each target kept), workspace + %s (the adapters' scratch)\n",
          human_bytes(e_act * (uint64_t)l->saved, a, sizeof a), human_bytes(e_act * (uint64_t)l->ws, e, sizeof e));
  if (l->nf4)
    fprintf(f, "    nf4: a block is %s stored (%s per rank, gathered as bytes); the dequantized bf16 working unit %s "
            "(in gathered)\n", human_bytes((uint64_t)l->nf4_block, a, sizeof a), human_bytes((uint64_t)l->nf4_shard, b, sizeof b),
            human_bytes(plan_lora_dequant_bytes(p), c, sizeof c));
}

/* The table's last parts: the predicted peak memory per rank (and whether it fits DEVICE_BYTES),
 * then the bytes each rank sends per step in every sharding mode. */
static void print_memory_and_traffic(const plan_t *p, FILE *f, uint64_t device_bytes) {
  char a[32], b[32], c[32], d[32], e[32], formula[256];
  fprintf(f, "\nPredicted peak memory per rank (S = %s, Pr = %s, Pb = %s, pb = %d, rb = %d, p = %d)\n",
          human_count(p->shard_total, a, sizeof a), human_count(p->units[0].padded, b, sizeof b),
          human_count(p->nunits > 1 ? p->units[1].padded : 0, c, sizeof c), jobspec_dtype_bytes(p->param_dtype),
          jobspec_dtype_bytes(p->reduce_dtype), p->prefetch);
  for (int k = 0; k < MEM_NCAT; k++)
    fprintf(f, "  %-12s %12s  %s\n", plan_mem_category_name((mem_category)k), human_bytes(p->mem[k], a, sizeof a),
            mem_formula(p, k, formula, sizeof formula));
  fprintf(f, "  %-12s %12s  (%s bytes)\n", "total", human_bytes(p->mem_total, a, sizeof a),
          human_count((int64_t)p->mem_total, b, sizeof b));
  if (p->host_bytes) {
    const char *off = !p->lora.rank ? "offload = optimizer: fp32 master, AdamW m and v, gradient staging: 16·S"
                      : p->lora.sharded ? "offload = optimizer: the adapters' fp32 master, AdamW m and v, gradient staging: 16·SA"
                                        : "offload = optimizer: the adapters' fp32 master, AdamW m and v, gradient staging: 16·NA";
    const char *snap = !p->lora.rank      ? "checkpoint snapshot ([checkpoint] async): 12·S"
                       : p->lora.sharded ? "checkpoint snapshot ([checkpoint] async): the adapters and AdamW m, v: 12·SA"
                                         : "checkpoint snapshot ([checkpoint] async): the adapters and AdamW m, v: 12·NA";
    fprintf(f, "  %-12s %12s  %s%s%s (host memory)\n", "host", human_bytes(p->host_bytes, a, sizeof a),
            p->host_bytes > p->snapshot_bytes ? off : "", p->host_bytes > p->snapshot_bytes && p->snapshot_bytes ? "; " : "",
            p->snapshot_bytes ? snap : "");
  }
  fprintf(f, "  activations per micro-batch (%s): block_saved %s, root_saved %s, head_ws %s, bwd_ws %s\n",
          p->device == DEVICE_CPU ? "floats" : "elements: bf16 acts, fp32 stats", human_count(p->act.block_saved, a, sizeof a),
          human_count(p->act.root_saved, b, sizeof b), human_count(p->act.head_ws, c, sizeof c),
          human_count(p->act.bwd_ws, d, sizeof d));
  if (p->lora.rank) print_lora(p, f);
  if (device_bytes) {
    double used = 100.0 * (double)p->mem_total / (double)device_bytes;
    if (p->mem_total <= device_bytes) {
      fprintf(f, "  device memory %s: fits (%.1f%% used)\n", human_bytes(device_bytes, a, sizeof a), used);
    } else if (p->sharding == SHARD_HYBRID) {
      fprintf(f, "  device memory %s: does NOT fit (%.1f%%); hybrid's memory is set by shard_group = %d, not by the "
              "world size: a larger group (or sharding = full) holds less per rank\n", human_bytes(device_bytes, a, sizeof a),
              used, p->shard_world);
    } else if (p->lora.rank) {   /* plan_min_world's model is a full fine-tune's: it would answer for another job */
      fprintf(f, "  device memory %s: does NOT fit (%.1f%%); --fit lists the changes that would\n",
              human_bytes(device_bytes, a, sizeof a), used);
    } else {
      int w = plan_min_world_of(p, device_bytes);
      if (w)
        fprintf(f, "  device memory %s: does NOT fit (%.1f%%); the smallest world size that fits is %d\n",
                human_bytes(device_bytes, a, sizeof a), used, w);
      else
        fprintf(f, "  device memory %s: does NOT fit (%.1f%%) at any world size up to %d\n",
                human_bytes(device_bytes, a, sizeof a), used, PLAN_MAX_WORLD);
    }
  }

  fprintf(f, "\nBytes sent per rank per optimizer step (ring: AG/RS send (N−1)/N of the unit, AR 2·(N−1)/N)\n");
  fprintf(f, "  %-10s %12s %14s %12s %12s\n", "sharding", "allgather", "reducescatter", "allreduce", "total");
  int last = p->sharding == SHARD_HYBRID ? SHARD_HYBRID : SHARD_NONE;   /* hybrid needs a G: its own plan's */
  for (int mode = SHARD_FULL; mode <= last; mode++) {
    uint64_t s[COLL_NKIND];
    plan_sent_bytes_if(p, (shard_mode)mode, s);
    fprintf(f, "  %-10s %12s %14s %12s %12s%s\n", jobspec_shard_mode_name((shard_mode)mode), human_bytes(s[0], a, sizeof a),
            human_bytes(s[1], b, sizeof b), human_bytes(s[2], c, sizeof c),
            human_bytes(s[0] + s[1] + s[2], e, sizeof e), mode == (int)p->sharding ? "  <- this plan" : "");
  }
  if (p->sharding == SHARD_HYBRID) print_hybrid_traffic(p, f);
}

void ctl_plan_print(const plan_t *p, FILE *f, uint64_t device_bytes) {
  if (!p || !f) return;
  const model_config *m = &p->model;
  char a[32], b[32], c[32], d[32];
  const arch_desc *ad = arch_get(m->arch);
  fprintf(f, "Model     %s  L=%d  H=%d  C=%d  V=%d  T=%d", jobspec_arch_name(m->arch), m->n_layer, m->n_head,
          m->n_embd, m->vocab_size, m->seq_len);
  ad->print_model(m, f);
  fprintf(f, "Ranks     world %d, sharding %s (shard_world %d), prefetch %d, param %s, reduce %s\n", p->world,
          jobspec_shard_mode_name(p->sharding), p->shard_world, p->prefetch, jobspec_dtype_kind_name(p->param_dtype),
          jobspec_dtype_kind_name(p->reduce_dtype));
  if (p->sharding == SHARD_HYBRID)
    fprintf(f, "Groups    %d shard groups of %d consecutive ranks (shard_group); each group holds a full replica\n",
            p->ngroups, p->shard_world);
  fprintf(f, "Batch     B=%d sequences x T=%d tokens per rank per micro-step, grad_accum %d: %s tokens per step\n",
          p->batch_size, m->seq_len, p->grad_accum,
          human_count((int64_t)p->batch_size * m->seq_len * p->grad_accum * p->world, a, sizeof a));
  fprintf(f, "\nParameters\n");
  put_label(f, "Ψ", 24);
  fprintf(f, " %16s  (%.1f M, %s)\n", human_count(p->n_params, a, sizeof a), (double)p->n_params / 1e6,
          ad->params_note(m));
  put_label(f, ad->no_emb_label(m), 24);
  fprintf(f, " %16s  (%.1f M)\n", human_count(p->n_params_no_emb, a, sizeof a), (double)p->n_params_no_emb / 1e6);
  put_label(f, "FLOPs per token", 24);
  double fl = p->flops_per_token;
  fprintf(f, " %16s  %s (%.2f %s)\n", human_count((int64_t)(fl + 0.5), a, sizeof a),
          ad->flops_formula(m),
          fl >= 1e9 ? fl / 1e9 : fl / 1e6, fl >= 1e9 ? "GFLOP" : "MFLOP");
  if (p->vocab_padded != m->vocab_size) {
    put_label(f, "padded classifier", 24);
    fprintf(f, " %16s  6·(Vp − V)·C: V=%d padded to Vp=%lld on CUDA (+%.2f%%)\n",
            human_count((int64_t)(p->pad_flops_per_token + 0.5), a, sizeof a), m->vocab_size,
            (long long)p->vocab_padded, 100.0 * p->pad_flops_per_token / fl);
  }

  fprintf(f, "\nUnits (each flat buffer padded to a multiple of %d x %d elements)\n", p->shard_world, PLAN_PAD_ALIGN);
  fprintf(f, "  %4s %-9s %7s %13s %13s %13s %15s\n", "unit", "name", "tensors", "numel", "padded", "shard_numel",
          "shard_base");
  const char *blk = ad->block_prefix;
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *pu = &p->units[u];
    if (p->nunits > 8 && u >= 3 && u < p->nunits - 2) {
      if (u == 3)
        fprintf(f, "  %4s %-9s (%s.2 .. %s.%d: the same sizes as %s.0)\n", "...", "", blk, blk, p->nunits - 4, blk);
      continue;
    }
    fprintf(f, "  %4d %-9s %7d %13s %13s %13s %15s\n", u, pu->name, pu->ntensors, human_count(pu->numel, a, sizeof a),
            human_count(pu->padded, b, sizeof b), human_count(pu->shard_numel, c, sizeof c),
            human_count(pu->shard_base, d, sizeof d));
  }
  fprintf(f, "  %4s %-9s %7s %13s %13s %13s %15s\n", "", "total", "", human_count(p->n_params, a, sizeof a), "",
          human_count(p->shard_total, b, sizeof b), "= S");

  fprintf(f, "\nTensors (offset in the unit's flat buffer; Hugging Face names and %s layout)\n",
          ad->layout);
  fprintf(f, "  %-8s %-*s %-13s %13s %13s  %s\n", "unit", name_width(p), "tensor", "shape", "numel", "offset", "decay");
  print_tensors(p, f, 0);
  if (p->nunits > 1) print_tensors(p, f, 1);
  if (p->nunits > 2) fprintf(f, "  %s.1 .. %s.%d: the same layout as %s.0\n", blk, blk, p->nunits - 2, blk);

  fprintf(f, "\nShards (rank r owns [offset, offset + length) of each unit's flat buffer)\n");
  fprintf(f, "  %5s %15s %13s", "rank", "root offset", "root length");
  if (p->nunits > 1) {
    char off[32], len[32];
    snprintf(off, sizeof off, "%s.* offset", blk);
    snprintf(len, sizeof len, "%s.* length", blk);
    fprintf(f, " %15s %13s", off, len);
  }
  fprintf(f, " %15s\n", "S (all units)");
  int ranks = p->shard_world;
  for (int r = 0; r < ranks; r++) {
    if (ranks > 16 && r >= 8 && r < ranks - 2) {
      if (r == 8) fprintf(f, "  %5s (ranks 8 .. %d: offset = rank x length; --json lists every rank)\n", "...", ranks - 3);
      continue;
    }
    print_shard_row(p, f, r);
  }
  if (p->shard_world == 1 && p->world > 1)
    fprintf(f, "  (sharding none: every one of the %d ranks holds the whole model)\n", p->world);
  if (p->sharding == SHARD_HYBRID)
    fprintf(f, "  (hybrid: rank r holds group rank r mod %d's shard; ranks r, r+%d, ... hold the same one)\n",
            p->shard_world, p->shard_world);

  print_memory_and_traffic(p, f, device_bytes);
}

/* ---- JSON ---- */

static json_t *jint(int64_t v) { return json_integer((json_int_t)v); }

static json_t *comm_json(const uint64_t s[COLL_NKIND]) {
  json_t *o = json_object();
  for (int k = 0; k < COLL_NKIND; k++) json_object_set_new(o, plan_coll_kind_name((coll_kind)k), jint((int64_t)s[k]));
  json_object_set_new(o, "total", jint((int64_t)(s[0] + s[1] + s[2])));
  return o;
}

/* [lora]'s split of the memory, per rank: the base by dtype, the adapters (their layout and the
 * elements this rank holds), their gradient and AdamW state, what they add to the activations, NF4's
 * dequantized working unit and the frozen root's gathered buffer. */
static json_t *lora_json(const plan_t *p) {
  const plan_lora *l = &p->lora;
  uint64_t NA = (uint64_t)plan_lora_held(p), e = p->device == DEVICE_CPU ? 4 : 2, am[MEM_NCAT], ahost;
  plan_lora_adapter_memory(p, am, &ahost);
  uint64_t ad = am[MEM_PARAM_SHARD];
  json_t *base = json_object();
  if (l->nf4) {
    json_object_set_new(base, "bf16", jint(2 * p->units[0].shard_numel));
    json_object_set_new(base, "nf4", jint((int64_t)(p->nunits - 1) * l->nf4_shard));
  } else {
    json_object_set_new(base, jobspec_dtype_kind_name(p->param_dtype), jint((int64_t)(p->mem[MEM_PARAM_SHARD] - ad)));
  }
  json_t *o = json_pack("{s:i, s:f, s:I, s:s, s:I, s:s, s:o, s:I, s:I, s:I, s:I, s:I, s:I}", "rank", l->rank, "alpha", l->alpha,
                   "adapter_elements", (json_int_t)l->numel, "adapters", l->sharded ? "sharded" : "replicated",
                   "adapter_elements_held", (json_int_t)NA, "base_dtype", l->nf4 ? "nf4" : jobspec_dtype_kind_name(p->param_dtype),
                   "base_bytes", base, "adapter_bytes", (json_int_t)ad, "adapter_grad_bytes", (json_int_t)am[MEM_GRAD_SHARD],
                   "adamw_bytes", (json_int_t)am[MEM_OPTIM_STATE], "adapter_host_bytes", (json_int_t)ahost,
                   "activation_bytes", (json_int_t)(e * (uint64_t)l->saved),
                   "dequant_unit_bytes", (json_int_t)plan_lora_dequant_bytes(p));
  /* the frozen root's buffer: its larger part where it is gathered in parts, else the whole root */
  json_object_set_new(o, "root_gathered_elements",
                      jint(p->sharding == SHARD_NONE ? p->units[0].padded : plan_root_part_max(p)));
  return o;
}

static json_t *plan_json(const plan_t *p, uint64_t device_bytes) {
  json_t *root = json_object();
  const model_config *m = &p->model;
  json_object_set_new(root, "model",
                      json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "arch", jobspec_arch_name(m->arch), "n_layer",
                                m->n_layer, "n_head", m->n_head, "n_embd", m->n_embd, "vocab_size", m->vocab_size,
                                "seq_len", m->seq_len));
  arch_model_json(json_object_get(root, "model"), m);   /* the architecture's keys beyond the shape, its own settings */
  json_object_set_new(root, "world", jint(p->world));
  json_object_set_new(root, "shard_world", jint(p->shard_world));
  json_object_set_new(root, "groups", jint(p->sharding == SHARD_HYBRID ? p->ngroups : 1));
  json_object_set_new(root, "sharding", json_string(jobspec_shard_mode_name(p->sharding)));
  json_object_set_new(root, "prefetch", jint(p->prefetch));
  json_object_set_new(root, "param_dtype", json_string(jobspec_dtype_kind_name(p->param_dtype)));
  json_object_set_new(root, "reduce_dtype", json_string(jobspec_dtype_kind_name(p->reduce_dtype)));
  json_object_set_new(root, "activation_checkpointing", json_string(jobspec_ackpt_mode_name(p->ackpt)));
  json_object_set_new(root, "offload", json_string(jobspec_offload_mode_name(p->offload)));
  json_object_set_new(root, "host_bytes", json_integer((json_int_t)p->host_bytes));
  json_object_set_new(root, "snapshot_bytes", json_integer((json_int_t)p->snapshot_bytes));
  json_object_set_new(root, "batch_size", jint(p->batch_size));
  json_object_set_new(root, "grad_accum", jint(p->grad_accum));
  json_object_set_new(root, "pad_align", jint(PLAN_PAD_ALIGN));
  json_object_set_new(root, "n_params", jint(p->n_params));
  json_object_set_new(root, "n_params_no_emb", jint(p->n_params_no_emb));
  json_object_set_new(root, "flops_per_token", json_real(p->flops_per_token));
  json_object_set_new(root, "vocab_padded", jint(p->vocab_padded));
  json_object_set_new(root, "pad_flops_per_token", json_real(p->pad_flops_per_token));
  json_object_set_new(root, "shard_total", jint(p->shard_total));

  json_t *units = json_array();
  for (int u = 0; u < p->nunits; u++) {
    const plan_unit *pu = &p->units[u];
    json_t *ju = json_object(), *ts = json_array(), *sh = json_array();
    json_object_set_new(ju, "index", jint(u));
    json_object_set_new(ju, "name", json_string(pu->name));
    json_object_set_new(ju, "numel", jint(pu->numel));
    json_object_set_new(ju, "padded", jint(pu->padded));
    json_object_set_new(ju, "shard_numel", jint(pu->shard_numel));
    json_object_set_new(ju, "shard_base", jint(pu->shard_base));
    for (int j = 0; j < pu->ntensors; j++) {
      const plan_tensor *t = &pu->t[j];
      json_t *shape = json_array();
      for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, jint(t->shape[d]));
      json_t *jt = json_pack("{s:s, s:i, s:o, s:I, s:I, s:b}", "name", t->name, "gid", t->gid, "shape", shape, "numel",
                             (json_int_t)t->numel, "offset", (json_int_t)t->offset, "decay", t->decay);
      if (t->hf_rows)   /* a part of a fused tensor: its rows of the tensor the file holds */
        json_object_set_new(jt, "rows", json_pack("[I, I, I]", (json_int_t)t->hf_row0,
                                                  (json_int_t)(t->hf_row0 + t->shape[0]), (json_int_t)t->hf_rows));
      json_array_append_new(ts, jt);
    }
    for (int r = 0; r < p->shard_world; r++)
      json_array_append_new(sh, json_pack("{s:i, s:I, s:I}", "rank", r, "offset",
                                          (json_int_t)plan_shard_offset(p, u, r), "length", (json_int_t)pu->shard_numel));
    json_object_set_new(ju, "tensors", ts);
    json_object_set_new(ju, "shards", sh);
    json_array_append_new(units, ju);
  }
  json_object_set_new(root, "units", units);

  json_object_set_new(root, "activations",
                      json_pack("{s:I, s:I, s:I, s:I}", "block_saved", (json_int_t)p->act.block_saved, "root_saved",
                                (json_int_t)p->act.root_saved, "head_ws", (json_int_t)p->act.head_ws, "bwd_ws",
                                (json_int_t)p->act.bwd_ws));
  json_t *mem = json_object();
  for (int k = 0; k < MEM_NCAT; k++) json_object_set_new(mem, plan_mem_category_name((mem_category)k), jint((int64_t)p->mem[k]));
  json_object_set_new(mem, "total", jint((int64_t)p->mem_total));
  json_object_set_new(root, "memory", mem);
  if (p->lora.rank) json_object_set_new(root, "lora", lora_json(p));

  json_object_set_new(root, "sent_bytes", comm_json(p->sent_bytes));
  json_t *modes = json_object();
  int last = p->sharding == SHARD_HYBRID ? SHARD_HYBRID : SHARD_NONE;
  for (int mode = SHARD_FULL; mode <= last; mode++) {
    uint64_t s[COLL_NKIND];
    plan_sent_bytes_if(p, (shard_mode)mode, s);
    json_object_set_new(modes, jobspec_shard_mode_name((shard_mode)mode), comm_json(s));
  }
  json_object_set_new(root, "sent_bytes_by_sharding", modes);
  uint64_t intra[COLL_NKIND];
  for (int k = 0; k < COLL_NKIND; k++) intra[k] = p->sent_bytes[k] - p->sent_inter[k];
  json_object_set_new(root, "sent_bytes_intra_group", comm_json(intra));
  json_object_set_new(root, "sent_bytes_inter_group", comm_json(p->sent_inter));

  if (device_bytes) {
    int fits = p->mem_total <= device_bytes;
    json_object_set_new(root, "device_memory",
                        json_pack("{s:I, s:b, s:i}", "bytes", (json_int_t)device_bytes, "fits", fits, "min_world",
                                  plan_min_world_of(p, device_bytes)));
  }
  return root;
}

fsdp_status ctl_plan_write_json(const plan_t *p, FILE *f, uint64_t device_bytes) {
  if (!p || !f) return fsdp_set_error(FSDP_ERR_INVALID, "ctl_plan_write_json: NULL plan or stream");
  json_t *j = plan_json(p, device_bytes);
  if (!j) return fsdp_set_error(FSDP_ERR_NOMEM, "no memory for the plan's JSON");
  int rc = json_dumpf(j, f, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
  json_decref(j);
  if (rc != 0 || fputc('\n', f) == EOF) return fsdp_set_error(FSDP_ERR_IO, "cannot write the plan's JSON");
  return FSDP_OK;
}
