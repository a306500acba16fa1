/* llama_family — Llama's two tables, for the architectures that are Llama with one more setting
 * (Mistral: a sliding window). Such an architecture's folder keeps only what differs: its
 * descriptor (models/<name>/<name>_arch.c) reads and writes its own config.json keys and job keys
 * and hands every other verb to llama_arch's; its model table (model_<name>.c) is llama_model's
 * verbs, which read the differences from p->model (model_config's sliding_window). No code is
 * copied: the tables are constant data, valid for the life of the process, and thread-safe.
 */
#ifndef FSDP_LLAMA_FAMILY_H
#define FSDP_LLAMA_FAMILY_H

#include "arch.h"

extern const arch_desc llama_arch;   /* llama_arch.c (libfsdpcommon) */

#ifdef FSDP_LLAMA_FAMILY_MODEL
#include "model.h"
extern const model_ops llama_model;  /* model_llama.c (fsdp-worker) */
#endif

#endif
