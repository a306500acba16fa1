/* gpt2_arch — GPT-2's descriptor (arch.h): units and Hugging Face names, config.json, plan terms. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "gpt2.h"
#include "hfconfig.h"
#include "plan_priv.h"

static int64_t root_numel(const model_config *m) {
  int64_t C = m->n_embd;
  return (int64_t)m->vocab_size * C + plan_positions(m) * C + 2 * C;
}
static int64_t block_numel(const model_config *m) {
  int64_t C = m->n_embd;
  return 12 * C * C + 13 * C;
}
static int64_t n_decay(const model_config *m) { return 2 + 4 * (int64_t)m->n_layer; }   /* wte, wpe; 4 per block */
/* the wpe lookup is no matmul; the tied wte is the head's */
static int64_t lookup_numel(const model_config *m) { return plan_positions(m) * m->n_embd; }
static int64_t embed_numel(const model_config *m) { return ((int64_t)m->vocab_size + plan_positions(m)) * m->n_embd; }

static plan_act act(const model_config *m, int B, device_kind dev, ackpt_mode ackpt) {
  int64_t T = m->seq_len, C = m->n_embd, H = m->n_head, V = m->vocab_size;
  int64_t BT = (int64_t)B * T, BTC = BT * C, ATT = plan_attention_floats(dev, B, T, H);
  int64_t DATT = plan_attention_scratch_floats(dev, B, T, H, C / H);
  int64_t e = dev == DEVICE_CPU ? 4 : 2, logits = plan_logits_bytes(dev, BT, V, C);
  if (logits < e * BTC) logits = e * BTC;   /* the slot dres reuses (model_gpt2.c): C > V, or a large B·T on CUDA */
  int64_t block = 16 * BTC + 4 * BT + ATT, block_bytes = e * 16 * BTC + 4 * (4 * BT + ATT);
  int ck = ackpt == ACKPT_FULL;
  /* checkpointing: each block keeps its output (the next block's input); the rest of a block's
   * activations live in one working set that the forward and the backward's recompute reuse, with
   * the forward's BTC scratch (the workspace holds the backward's scratch during a recompute) */
  return (plan_act){
    .block_saved = ck ? BTC : block,
    .block_ws = ck ? block : 0,
    .block_bytes = ck ? e * BTC : block_bytes,
    .block_ws_bytes = ck ? block_bytes : 0,
    .root_saved = 2 * BTC + 2 * BT,
    .head_ws = logits / 4 + BT + BTC,
    .bwd_ws = 7 * BTC + DATT,
    .root_bytes = e * 2 * BTC + 4 * 2 * BT,
    .head_ws_bytes = logits + 4 * BT + e * BTC,
    .bwd_ws_bytes = e * 7 * BTC + 4 * DATT,
  };
}

static fsdp_status check(const model_config *m) {
  if (m->n_kv_head != m->n_head)
    return fsdp_set_error(FSDP_ERR_INVALID, "arch = gpt2 has n_kv_head = n_head = %d, not %d", m->n_head, m->n_kv_head);
  return FSDP_OK;
}

/* GPT-2 always ties and has no rotary: one identity for every GPT-2 spec */
static void canonical(model_config *m) {
  m->tie_embeddings = 1;
  m->rope_scaling = ROPE_SCALING_NONE;
  m->rope_factor = m->rope_low_freq_factor = m->rope_high_freq_factor = 0;
  m->rope_original_max_pos = 0;
}

/* The root (wte, wpe, ln_f) and one unit per block, Hugging Face GPT-2 names. */
static void units(plan_t *p) {
  const model_config *m = &p->model;
  int64_t C = m->n_embd;
  plan_unit *r = &p->units[0];
  snprintf(r->name, sizeof r->name, "root");
  plan_add_tensor(r, "wte.weight", ROOT_WTE, m->vocab_size, C);
  plan_add_tensor(r, "wpe.weight", ROOT_WPE, plan_positions(m), C);
  plan_add_tensor(r, "ln_f.weight", ROOT_LNF_W, C, 0);
  plan_add_tensor(r, "ln_f.bias", ROOT_LNF_B, C, 0);
  static const struct { const char *suffix; int rows, cols; } blk[BLK_NT] = {
    [BLK_LN1_W] = {"ln_1.weight", 1, 0},           [BLK_LN1_B] = {"ln_1.bias", 1, 0},
    [BLK_ATTN_W] = {"attn.c_attn.weight", 1, 3},   [BLK_ATTN_B] = {"attn.c_attn.bias", 3, 0},
    [BLK_ATTNPROJ_W] = {"attn.c_proj.weight", 1, 1}, [BLK_ATTNPROJ_B] = {"attn.c_proj.bias", 1, 0},
    [BLK_LN2_W] = {"ln_2.weight", 1, 0},           [BLK_LN2_B] = {"ln_2.bias", 1, 0},
    [BLK_FC_W] = {"mlp.c_fc.weight", 1, 4},        [BLK_FC_B] = {"mlp.c_fc.bias", 4, 0},
    [BLK_FCPROJ_W] = {"mlp.c_proj.weight", 4, 1},  [BLK_FCPROJ_B] = {"mlp.c_proj.bias", 1, 0},
  };
  for (int i = 0; i < m->n_layer; i++) {
    plan_unit *u = &p->units[1 + i];
    snprintf(u->name, sizeof u->name, "h.%d", i);
    for (int j = 0; j < BLK_NT; j++) {
      char name[64];
      snprintf(name, sizeof name, "h.%d.%s", i, blk[j].suffix);
      plan_add_tensor(u, name, ROOT_NT + BLK_NT * i + j, blk[j].rows * C, blk[j].cols * C);
    }
  }
}

/* With or without "transformer."; a block's name picks its unit by number. */
static const plan_tensor *find(const plan_t *p, const char *name, int *unit) {
  if (!strncmp(name, "transformer.", 12)) name += 12;
  int u = 0;
  if (!strncmp(name, "h.", 2)) {
    char *end;
    long i = strtol(name + 2, &end, 10);
    if (end == name + 2 || *end != '.' || i < 0 || i >= p->nunits - 1) return NULL;
    u = 1 + (int)i;
  }
  const plan_unit *pu = &p->units[u];
  for (int j = 0; j < pu->ntensors; j++)
    if (!strcmp(pu->t[j].name, name)) {
      if (unit) *unit = u;
      return &pu->t[j];
    }
  return NULL;
}

static int head_slot(const model_config *m) {
  (void)m;
  return ROOT_WTE;
}

/* ---- config.json: GPT2Config ---- */

static fsdp_status hf_parse(const json_t *o, const char *path, model_config *m) {
  m->arch = ARCH_GPT2;
  TRY(hf_get_int(o, path, "n_layer", -1, &m->n_layer));
  TRY(hf_get_int(o, path, "n_head", -1, &m->n_head));
  TRY(hf_get_int(o, path, "n_embd", -1, &m->n_embd));
  TRY(hf_get_int(o, path, "vocab_size", -1, &m->vocab_size));
  TRY(hf_get_int(o, path, "n_positions", 1024, &m->n_positions));
  m->n_kv_head = m->n_head;   /* tie_embeddings stays 0: it is Llama's choice; GPT-2 always ties */
  int inner;
  double eps;
  TRY(hf_get_int(o, path, "n_inner", 4 * m->n_embd, &inner));
  TRY(hf_get_num(o, path, "layer_norm_epsilon", 1e-5, &eps));
  if (inner != 4 * m->n_embd)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: n_inner = %d is not computed by fsdpd; allowed: null or 4 x n_embd "
                          "= %d", path, inner, 4 * m->n_embd);
  if (fabs(eps - 1e-5) > 1e-12)
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: layer_norm_epsilon = %g is not computed by fsdpd; allowed: 1e-05",
                          path, eps);
  json_t *act = json_object_get(o, "activation_function");
  const char *a = json_string_value(act);
  if (act && !json_is_null(act) && (!a || (strcmp(a, "gelu_new") && strcmp(a, "gelu_pytorch_tanh"))))
    return fsdp_set_error(FSDP_ERR_UNSUPPORTED, "%s: activation_function = %s is not computed by fsdpd; allowed: "
                          "gelu_new, gelu_pytorch_tanh (GELU's tanh approximation)", path, a ? a : "?");
  TRY(hf_want_bool(o, path, "scale_attn_weights", 1, "attention scores divided by sqrt(head size)"));
  TRY(hf_want_bool(o, path, "scale_attn_by_inverse_layer_idx", 0, "the same attention scale in every layer"));
  return hf_want_bool(o, path, "tie_word_embeddings", 1, "GPT-2's head is wte");
}

/* GPT-2's special token 50256 is named only when the vocabulary holds it; the dropouts are 0, what
 * fsdpd trained with (GPT2Config's defaults, where absent, are 0.1). */
static json_t *hf_own_config(const model_config *m) {
  int npos = m->n_positions > 0 ? m->n_positions : m->seq_len;
  json_t *special = m->vocab_size > 50256 ? json_integer(50256) : json_null();
  return json_pack("{s:s, s:[s], s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:f, s:b, s:o, s:o, s:f, s:f, s:f}", "model_type",
                   "gpt2", "architectures", "GPT2LMHeadModel", "n_layer", m->n_layer, "n_head", m->n_head, "n_embd",
                   m->n_embd, "vocab_size", m->vocab_size, "n_positions", npos, "n_ctx", npos, "activation_function",
                   "gelu_new", "layer_norm_epsilon", 1e-5, "tie_word_embeddings", 1, "bos_token_id", special,
                   "eos_token_id", json_incref(special), "embd_pdrop", 0.0, "attn_pdrop", 0.0, "resid_pdrop", 0.0);
}

/* GPT2LMHeadModel's: after the embeddings, on the attention weights, on each residual branch */
static const arch_dropout dropout[] = {{"embd_pdrop", 0.1}, {"attn_pdrop", 0.1}, {"resid_pdrop", 0.1}, {NULL, 0}};

static const arch_hf_key hf_keys[] = {
  {"arch", "model_type"}, {"n_layer", "n_layer"}, {"n_head", "n_head"}, {"n_embd", "n_embd"},
  {"vocab_size", "vocab_size"}, {"n_positions", "n_positions"}, {"tie_word_embeddings", "tie_word_embeddings"},
  {NULL, NULL},
};

/* ---- checkpoints, plan output ---- */

static void model_json(json_t *jm, const model_config *m) { (void)jm, (void)m; }
static int manifest_fix(model_config *m) {
  m->tie_embeddings = 1;
  return 0;
}
static int same_model(const model_config *a, const model_config *b) { return (void)a, (void)b, 1; }
static void describe(const model_config *m, char *buf, size_t n) {
  (void)m;
  if (n) buf[0] = '\0';
}
static void print_model(const model_config *m, FILE *f) {
  (void)m;
  fputc('\n', f);
}
static const char *params_note(const model_config *m) { return (void)m, "the tied wte counted once"; }
static const char *no_emb_label(const model_config *m) { return (void)m, "Ψ without wte and wpe"; }
static const char *flops_formula(const model_config *m) { return (void)m, "6·(Ψ − wpe) + 12·L·C·T"; }
static fsdp_status no_file_check(const plan_t *p, const char *path, int (*has)(const void *, const char *),
                                 const void *f) {
  (void)p, (void)path, (void)has, (void)f;
  return FSDP_OK;
}
static fsdp_status no_missing(const plan_t *p, const char *name, const char *where) {
  (void)p, (void)name, (void)where;
  return FSDP_OK;
}

static const char *const probe_names[] = {"wte.weight", "h.0.attn.c_attn.weight", NULL};

/* Conv1D's in and out; the adapters are nn.Linear's [r, in] and [out, r] (peft's). */
static int lora_modules(const model_config *m, arch_lora_module *o) {
  int64_t C = m->n_embd;
  o[0] = (arch_lora_module){"attn.c_attn", BLK_ATTN_W, C, 3 * C, 0, 3 * C};
  o[1] = (arch_lora_module){"attn.c_proj", BLK_ATTNPROJ_W, C, C, 0, C};
  o[2] = (arch_lora_module){"mlp.c_fc", BLK_FC_W, C, 4 * C, 0, 4 * C};
  o[3] = (arch_lora_module){"mlp.c_proj", BLK_FCPROJ_W, 4 * C, C, 0, C};
  return 4;
}

const arch_desc gpt2_arch = {
  .id = ARCH_GPT2,
  .name = "gpt2",
  .hf_model_type = "gpt2",
  .job_keys = NULL,
  .why_not = "GPT-2 has n_kv_head = n_head, an MLP of 4 x n_embd, LayerNorm eps 1e-5 and learned positions",
  .always_tied = 1,
  .tied_why = "GPT-2's output head is always its wte",
  .tie_pair = {"wte.weight", "lm_head.weight"},
  .rotary = 0,
  .hf_keys = hf_keys,
  .hf_parse = hf_parse,
  .hf_own_config = hf_own_config,
  .dropout = dropout,
  .root_numel = root_numel,
  .block_numel = block_numel,
  .n_decay = n_decay,
  .lookup_numel = lookup_numel,
  .embed_numel = embed_numel,
  .act = act,
  .check = check,
  .canonical = canonical,
  .units = units,
  .find = find,
  .head_slot = head_slot,
  .lora_default = "c_attn",
  .lora_block_hf = "transformer.h.%d.",
  .lora_modules = lora_modules,
  .probe_names = probe_names,
  .file_desc = "a GPT-2 model (wte.weight, h.0.…)",
  .reads = "wte.weight, h.0.…",
  .file_check = no_file_check,
  .missing = no_missing,
  .model_json = model_json,
  .manifest_fix = manifest_fix,
  .same_model = same_model,
  .describe = describe,
  .print_model = print_model,
  .params_note = params_note,
  .no_emb_label = no_emb_label,
  .flops_formula = flops_formula,
  .block_prefix = "h",
  .layout = "Conv1D",
  .name_width = 26,
};
