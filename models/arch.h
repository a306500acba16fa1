/* arch — one descriptor per architecture, and the table that registers them (docs/design.md §2,
 * docs/models.md).
 *
 * Everything the coordinator, the client and a worker's loading code need to know about an
 * architecture sits in its descriptor, in its folder (models/<name>/<name>_arch.c): its FSDP units
 * and their Hugging Face tensor names and layouts, the config.json keys it reads (transformers 4
 * and 5 forms) and the config it writes, the [model] job keys that apply to it, its plan terms
 * (parameters, FLOPs, activations), its checkpoint-manifest keys and what `fsdpctl plan` prints of
 * it. The planner, safetensors, hfconfig, the checkpoint manifest, export and the plan output call
 * through it and never branch on the architecture. Its forward and backward are the worker's
 * half (worker/model/model.h's model_ops, models/<name>/model_<name>.c).
 *
 * The table (arch.c) is built from models/models.def, one line per architecture. Descriptors are
 * constant data, valid for the life of the process; every function here is pure and thread-safe.
 */
#ifndef FSDP_ARCH_H
#define FSDP_ARCH_H

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

#include "err.h"
#include "plan.h"

struct st_file;

/* A [model] key and the config.json key that carries it ("n_embd" → "hidden_size"). */
typedef struct arch_hf_key {
  const char *ini, *hf;
} arch_hf_key;

/* A config.json key that is a dropout probability the Hugging Face model applies in training, and
 * its config class's default where the key is absent (GPT2Config's attn_pdrop: 0.1). */
typedef struct arch_dropout {
  const char *key;
  double dflt;
} arch_dropout;

/* A projection [lora] targets can adapt: its module path inside a block as Hugging Face names it
 * ("attn.c_attn", "self_attn.q_proj"; a target names it by its last part), the block slot of its
 * base weight, its input and output widths, and where the model computes its output: columns
 * [col0, col0 + out) of rows ld wide (a fused q|k|v or gate|up; else col0 = 0, ld = out). */
#define ARCH_LORA_MAX 8
typedef struct arch_lora_module {
  const char *path;
  int slot;
  int64_t in, out, col0, ld;
} arch_lora_module;

/* An architecture's own [model] setting, one no other architecture shares (Gemma 3's
 * query_pre_attn_scalar): entry i of arch_desc.ext_keys is model_config.ext[i]. Common code parses
 * it in [model] (only under that architecture), writes it in the resolved job, the defaults file,
 * the checkpoint manifest and plan --json, and compares it; the folder gives it meaning. A bool is
 * written true | false (ext 1 | 0), an int as an integer. */
typedef enum { ARCH_EXT_INT = 0, ARCH_EXT_DOUBLE, ARCH_EXT_BOOL } arch_ext_kind;
typedef struct arch_ext_key {
  const char *key;       /* the [model] key, and its name in the manifest and plan --json */
  arch_ext_kind kind;
  double lo, hi;         /* the range, inclusive; lo excluded where lo_open (a bool: 0..1) */
  int lo_open;
  const char *def;       /* the default as a job file writes it */
  const char *help;      /* for fsdpctl plan --defaults */
} arch_ext_key;

typedef struct arch_desc {
  model_arch id;
  const char *name;            /* [model] arch, the manifest's "arch", the folder: "gpt2" */
  const char *hf_model_type;   /* config.json's model_type: "gpt2" */

  /* ---- [model] job keys ---- */
  /* The keys beyond the common shape (n_layer, n_head, n_embd, vocab_size, seq_len, n_positions,
   * tie_word_embeddings) that apply to it; NULL-terminated. Another architecture's key in a job of
   * this one is refused, naming WHY_NOT ("GPT-2 has n_kv_head = n_head, ..."). */
  const char *const *job_keys;
  const char *why_not;
  /* Its own settings (arch_ext_key): {NULL}-terminated, at most MODEL_EXT_MAX; NULL for none. */
  const arch_ext_key *ext_keys;
  /* 1: the head is always the embedding (GPT-2): tie_word_embeddings = false is refused, saying
   * TIED_WHY; 0: a job file's default is untied (LlamaConfig's). */
  int always_tied;
  const char *tied_why;
  /* The embedding and the head an untied model adds, as its weights name them
   * ({"model.embed_tokens.weight", "lm_head.weight"}). A tied model's weights that also hold the head
   * equal to the embedding are read as the tied model (the copy ignored, safetensors.h's
   * st_tied_head); a tied config.json whose weights hold a different one is read untied, as
   * transformers reads it (st_model.h's st_model_untie), or refused where ALWAYS_TIED. */
  const char *tie_pair[2];
  /* 1: rotary positions (rope_theta, rope_scaling; an even head size); grouped-query heads and a
   * separate MLP width (ffn_dim, required and even) come with the keys above. */
  int rotary;

  /* ---- config.json ---- */
  const arch_hf_key *hf_keys;   /* {NULL, NULL}-terminated; a [model] key absent here has no config key */
  /* Read O (PATH names it in messages) into M (arch, shapes, every choice the config makes);
   * refuse in one line what the architecture does not compute. */
  fsdp_status (*hf_parse)(const json_t *o, const char *path, model_config *m);
  /* Its dropout keys, {NULL, 0}-terminated: fsdpd applies no dropout, so a non-zero one is refused
   * unless the job says [model] dropout = none (hfconfig.h's hf_config.dropout_key). */
  const arch_dropout *dropout;
  /* fsdpd's own config.json for M (a model that came from no folder); a new reference. */
  json_t *(*hf_own_config)(const model_config *m);

  /* ---- units and plan terms (plan.h) ---- */
  int64_t (*root_numel)(const model_config *m);
  int64_t (*block_numel)(const model_config *m);
  int64_t (*n_decay)(const model_config *m);        /* 2-D tensors: AdamW decays them */
  int64_t (*lookup_numel)(const model_config *m);   /* embedding elements read by lookup, no matmul */
  int64_t (*embed_numel)(const model_config *m);    /* every embedding tensor's elements, counted once */
  plan_act (*act)(const model_config *m, int B, device_kind dev, ackpt_mode ackpt);
  /* Optional (NULL: C): the width of a token's queries, NH·HD, for attention's FLOPs (12·L·width·T). */
  int64_t (*attn_dim)(const model_config *m);
  /* Optional (NULL: every layer full): layer LAYER's attention window W (query t sees keys
   * t − W < s ≤ t), 0 for full causal attention; its FLOPs count the window's share of the scores. */
  int (*attn_window)(const model_config *m, int layer);
  /* Range checks of a model that came over the wire or from a job file (n_kv_head already 0 → n_head). */
  fsdp_status (*check)(const model_config *m);
  /* The one identity of every spec of it: settings it does not have are set to their only value. */
  void (*canonical)(model_config *m);
  void (*units)(plan_t *p);   /* p->units allocated, p->model set: add every unit's tensors */
  /* NAME in any of the forms Hugging Face writes it; NULL if the plan has no such tensor. */
  const plan_tensor *(*find)(const plan_t *p, const char *name, int *unit);
  int (*head_slot)(const model_config *m);   /* the root slot the output head multiplies with */

  /* ---- LoRA ([lora], plan.h's plan_lora) ---- */
  const char *lora_default;     /* peft's default targets for the family: "c_attn", "q_proj,v_proj"; NULL where
                                   peft has none (Phi-3): [lora] targets is then required */
  const char *lora_block_hf;    /* a block's prefix in the Hugging Face model's names: "transformer.h.%d." */
  /* Every module a target can name, in the order the block computes them; returns the count (≤ ARCH_LORA_MAX). */
  int (*lora_modules)(const model_config *m, arch_lora_module *out);

  /* ---- weights files (safetensors.c) ---- */
  const char *const *probe_names;   /* names (bare, as st_find takes them) that tell a file of it */
  const char *file_desc;            /* "a GPT-2 model (wte.weight, h.0.…)" */
  const char *reads;                /* "wte.weight, h.0.…" */
  /* Refuse a file of this architecture that is another model than the job's (its head tied or not),
   * or FSDP_OK; HAS tells whether the file holds a name (st_find ≥ 0). */
  fsdp_status (*file_check)(const plan_t *p, const char *path, int (*has)(const void *f, const char *name),
                            const void *f);
  /* The message for NAME missing from WHERE when the architecture can say why (a tied file under an
   * untied job), else FSDP_OK (the caller's generic message). */
  fsdp_status (*missing)(const plan_t *p, const char *name, const char *where);

  /* ---- the checkpoint manifest, plan --json ---- */
  /* The keys beyond the common shape into the "model" object JM (the manifest and plan --json). */
  void (*model_json)(json_t *jm, const model_config *m);
  /* After a manifest's model was read (every key above optional): fill the architecture's own
   * defaults into M and say whether it is consistent (0) or not (-1). */
  int (*manifest_fix)(model_config *m);
  /* Optional: the keys of model_json beyond manifest_fix's from the manifest's "model" object JM into
   * M (a key absent: the value of a checkpoint that predates it). */
  void (*manifest_read)(const json_t *jm, model_config *m);
  /* Whether A and B (both of this architecture) are the same model; their settings beyond the
   * shape into BUF for a message ("" when none). */
  int (*same_model)(const model_config *a, const model_config *b);
  void (*describe)(const model_config *m, char *buf, size_t n);

  /* ---- fsdpctl plan ---- */
  void (*print_model)(const model_config *m, FILE *f);   /* after "Model  arch L= H= C= V= T=", up to its lines' end */
  const char *(*params_note)(const model_config *m);     /* "the tied wte counted once" */
  const char *(*no_emb_label)(const model_config *m);    /* "Ψ without wte and wpe" */
  const char *(*flops_formula)(const model_config *m);   /* "6·(Ψ − wpe) + 12·L·C·T" */
  const char *block_prefix;   /* the block units' name stem: "h", "layers" */
  const char *layout;         /* the projections' layout: "Conv1D", "nn.Linear [out, in]" */
  int name_width;             /* the tensor column's width */
} arch_desc;

/* The descriptor of A; NULL if A is none of the table's. */
const arch_desc *arch_get(model_arch a);
/* By [model] arch name / by config.json model_type; NULL if none. */
const arch_desc *arch_by_name(const char *name);
const arch_desc *arch_by_hf_type(const char *model_type);
int arch_count(void);
/* "gpt2, llama": every name (or model_type), SEP between them, into BUF. */
const char *arch_names(char *buf, size_t n, const char *sep, int hf_types);
/* Whether [model] KEY applies to D: a common shape key or one of its job_keys. */
int arch_key_applies(const arch_desc *d, const char *key);
/* The first architecture KEY applies to that is not D (the refusal's "set arch = ..."), or NULL; KEY
 * one of its job_keys or ext_keys. */
const arch_desc *arch_key_owner(const arch_desc *d, const char *key);
/* The config.json key that carries [model] KEY under D, or NULL. */
const char *arch_hf_key_of(const arch_desc *d, const char *key);

/* ---- an architecture's own settings (arch_ext_key) ---- */
int arch_ext_count(const arch_desc *d);
/* KEY's index in D's ext_keys, or -1. */
int arch_ext_index(const arch_desc *d, const char *key);
/* Whether KEY is some architecture's own setting. */
int arch_ext_known(const char *key);
/* TEXT as K's value into *V: 1, or 0 when it is not one (its type or range; arch_ext_allowed says). */
int arch_ext_parse(const arch_ext_key *k, const char *text, double *v);
void arch_ext_allowed(const arch_ext_key *k, char *buf, size_t n);   /* "a number > 0 and <= 1e6" */
void arch_ext_format(const arch_ext_key *k, double v, char *buf, size_t n);   /* as a job file writes it */
/* M's settings set to its architecture's defaults (the others 0). */
void arch_ext_defaults(model_config *m);
/* The model's keys beyond the common shape into JM: the descriptor's model_json and its settings. */
void arch_model_json(json_t *jm, const model_config *m);
/* M's settings from a manifest's "model" object JM (one absent: its default); -1 when one is malformed. */
int arch_ext_read(const json_t *jm, model_config *m);
/* Whether A and B (of one architecture) are the same model: its same_model and its settings. */
int arch_same_model(const model_config *a, const model_config *b);
/* Its describe(), and its settings ", key value", for a message. */
void arch_describe(const model_config *m, char *buf, size_t n);

#endif
