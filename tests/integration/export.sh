#!/usr/bin/env bash
# fsdpctl export: a 2-rank checkpoint becomes one .safetensors file, byte-identical to the model the
# ranks themselves consolidate at the end (fsdp-worker --save); bad input gets a one-line error.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d /tmp/fsdp-it-export.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/job.ini" <<JOB
[job]
name = export
steps = 6
[model]
n_layer = 2
n_head = 2
n_embd = 32
vocab_size = 64
seq_len = 16
[data]
train = synthetic:markov:4
batch_size = 2
[fsdp]
world_size = 2
timeout_s = 30
[checkpoint]
dir = ckpt
every = 3
JOB
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run timeout 120 "$src/scripts/launch-standalone.sh" 2 "$tmp/job.ini" \
  --save "$tmp/final.safetensors" > /dev/null
"$build/fsdpctl" export "$tmp/ckpt" -o "$tmp/exported.safetensors"
cmp "$tmp/final.safetensors" "$tmp/exported.safetensors"
"$build/fsdpctl" export "$tmp/ckpt" --step 3 -o "$tmp/step3.safetensors"
! cmp -s "$tmp/final.safetensors" "$tmp/step3.safetensors"
# The step directory itself (what `ls` shows) is accepted too, and is the same checkpoint.
"$build/fsdpctl" export "$tmp/ckpt/$(printf 'step-%08d' 3)/" -o "$tmp/step3b.safetensors"
cmp "$tmp/step3.safetensors" "$tmp/step3b.safetensors"
set +e
msg=$("$build/fsdpctl" export "$tmp/ckpt/$(printf 'step-%08d' 3)" --step 6 -o "$tmp/x.safetensors" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && case "$msg" in *"step 3, but --step says 6"*) true;; *) false;; esac || { echo "step dir with another --step: rc $rc: $msg"; exit 1; }
# A job initialized from the export: same parameter count, loads without complaint.
sed -e "s|^\[model\]|[model]\ninit = $tmp/exported.safetensors|" -e 's/^steps = 6/steps = 1/' \
    -e '/^\[checkpoint\]/,$d' "$tmp/job.ini" > "$tmp/job2.ini"
FSDP_WORKER=$build/fsdp-worker FSDP_OUT=$tmp/run2 timeout 60 "$src/scripts/launch-standalone.sh" 2 "$tmp/job2.ini" > /dev/null
# Bad input: one line on stderr, exit 1 (2 for usage).
set +e
msg=$("$build/fsdpctl" export "$tmp/nowhere" -o "$tmp/x.safetensors" 2>&1); rc=$?
set -e
[ "$rc" -eq 1 ] && [ "$(printf '%s\n' "$msg" | wc -l)" -eq 1 ] || { echo "bad dir: rc $rc: $msg"; exit 1; }
! grep -Eq '[a-z_]+\.(c|h):[0-9]+:' <<<"$msg" || { echo "a source location in: $msg"; exit 1; }
echo "$msg"
set +e
"$build/fsdpctl" export "$tmp/ckpt" > /dev/null 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || { echo "missing -o: rc $rc"; exit 1; }
echo "export: ok"
