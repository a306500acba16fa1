# The small job the standalone tests train, written from one template; sourced, not run.
#   tiny_job FILE [SECTION.KEY=VALUE ...]
# writes a one-step job of a 1-layer, 16-wide GPT-2 (vocabulary 64, sequences of 16) on 2 ranks,
# Markov tokens, batch 1, no accumulation, timeout_s 60; each SECTION.KEY=VALUE sets that key
# (replacing the template's line, or adding one at the end of the section).
tiny_job() {
  python3 - "$@" <<'PY'
import sys
job = {"job": {"steps": "1"},
       "model": {"n_layer": "1", "n_head": "2", "n_embd": "16", "vocab_size": "64", "seq_len": "16"},
       "data": {"train": "synthetic:markov:1", "batch_size": "1", "grad_accum": "1"},
       "fsdp": {"world_size": "2", "timeout_s": "60"}}
for kv in sys.argv[2:]:
    key, sep, value = kv.partition("=")
    section, dot, name = key.partition(".")
    if not sep or not dot or not name:
        sys.exit(f"tiny_job: '{kv}' is not SECTION.KEY=VALUE")
    job.setdefault(section, {})[name] = value
with open(sys.argv[1], "w") as f:
    for section, keys in job.items():
        f.write(f"[{section}]\n" + "".join(f"{k} = {v}\n" for k, v in keys.items()))
PY
}
