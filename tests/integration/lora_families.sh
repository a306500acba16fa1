#!/usr/bin/env bash
# LoRA on every other family (Qwen2, Qwen3, Mistral, Gemma 3, Phi-3) against peft: lora_peft.sh's parts in
# its families mode (see there).
exec bash "$(dirname "$0")/lora_peft.sh" "$1" "$2" families
