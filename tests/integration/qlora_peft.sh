#!/usr/bin/env bash
# QLoRA ([lora] base_dtype = nf4) against peft over the same dequantized base: lora_peft.sh's parts in
# its nf4 mode (see there).
exec bash "$(dirname "$0")/lora_peft.sh" "$1" "$2" nf4
