/* peft — LoRA adapters in PEFT's folder format (docs/models.md "LoRA"): adapter_config.json and
 * adapter_model.safetensors, with peft's tensor names ("base_model.model.model.layers.0.self_attn.
 * q_proj.lora_A.weight", plan_lora_name), as PeftModel.save_pretrained writes them and
 * PeftModel.from_pretrained(base, DIR) reads them. The adapters are P's LoRA segment (plan.h's
 * plan_lora: block by block, target by target, A [r, in] then B [out, r], fp32). Pure I/O: any
 * thread; the caller owns the buffers.
 */
#ifndef FSDP_PEFT_H
#define FSDP_PEFT_H

#include "err.h"
#include "jobspec.h"
#include "plan.h"

/* Check DIR's adapter_config.json against P's [lora] (a LoRA adapter of the same rank, alpha and
 * target modules) and every adapter tensor of P in its safetensors (present, its shape; no adapter
 * tensor P does not have); each refusal one line, opening with WHO (the setting that named DIR:
 * "[lora] init_from", "--adapter"). With OUT (p->lora.numel floats) also read them. */
fsdp_status peft_load(const plan_t *p, const char *dir, float *out, const char *who);
/* Write ADAPTERS as a PEFT folder DIR (created, or an empty directory; all removed on failure);
 * BASE is the base model's folder, adapter_config.json's base_model_name_or_path (null when BASE is ""
 * or NULL: a base with no folder). */
fsdp_status peft_save(const plan_t *p, const float *adapters, const char *dir, const char *base);

/* SPEC's [lora] (rank, alpha, targets; dropout 0, which inference does not apply) from DIR's
 * adapter_config.json, for a model that loads the adapter (fsdpctl sample --adapter); what fsdpd does
 * not compute (DoRA, rsLoRA, per-module ranks or alphas) is refused in one line. */
fsdp_status peft_read_config(const char *dir, jobspec_t *spec);
/* Merge the adapters into the base, as peft's merge_and_unload: every target weight W of WHOLE (the
 * whole model in the layout of P, a one-rank plan with lora.rank ≥ 1) += (alpha / r)·B·A (transposed
 * for GPT-2's Conv1D), the product in fp64, rounded once into W. */
void peft_merge(const plan_t *p, float *whole, const float *adapters);

#endif
