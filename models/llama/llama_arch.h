/* llama_arch — Llama's descriptor for the architectures built on it (models/phi3/: the same units,
 * math and plan terms, other names and config.json): they call its functions through it rather
 * than copy them. Constant data (models/arch.h). */
#ifndef FSDP_LLAMA_ARCH_H
#define FSDP_LLAMA_ARCH_H

#include "arch.h"

extern const arch_desc llama_arch;

#endif
