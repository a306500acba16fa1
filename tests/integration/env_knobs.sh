#!/usr/bin/env bash
# env_knobs — every FSDP_* environment variable is declared once: the programs read them only
# through common/envknob.c's table (no getenv of an FSDP_* name, or of the CURVE key variables,
# anywhere else in common/, daemon/, worker/, client/, proto/), and docs/operations.md's table
# ("The environment fsdpd reads") lists exactly its rows, with the same defaults. A worker refuses a
# bad value of a knob with a fixed set of values (FSDP_CPU_DEVICE, FSDP_CPU_BF16, FSDP_TRACE) in one
# line before the rendezvous: rank 0 of 2, started alone, exits at once and publishes nothing.
# Usage: bash env_knobs.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "$1" "$2" envknobs
python3 - "$SRC" <<'PY' || fail "the environment knobs and their table disagree"
import pathlib, re, sys
src = pathlib.Path(sys.argv[1])
rows = re.findall(r'\[ENV_\w+\] = \{"(FSDP_\w+)", (NULL|"[^"]*")', (src / "common/envknob.c").read_text())
table = {name: (None if d == "NULL" else d.strip('"')) for name, d in rows}
assert len(table) == len(rows) and len(rows) >= 10, rows
doc = (src / "docs/operations.md").read_text().split("### The environment fsdpd reads", 1)[1].split("\n## ", 1)[0]
documented = {}
for m in re.finditer(r'^\| `(FSDP_\w+)` \| ([^|]*) \|', doc, re.M):
    d = m.group(2).strip()
    documented[m.group(1)] = None if d.startswith("none") else d.strip("`")
bad = []
for name in sorted(set(table) | set(documented)):
    if name not in documented: bad.append(f"{name}: in common/envknob.c, not in docs/operations.md's table")
    elif name not in table: bad.append(f"{name}: in docs/operations.md's table, not in common/envknob.c")
    elif table[name] != documented[name]: bad.append(f"{name}: default {table[name]!r} in envknob.c, {documented[name]!r} in the docs")
pat = re.compile(r'getenv\(\s*("FSDP_|CURVE_ENV_)')
for d in ("common", "daemon", "worker", "client", "proto"):
    for f in (src / d).rglob("*"):
        if f.suffix in (".c", ".cc", ".cu", ".h", ".cuh") and f.name != "envknob.c":
            for i, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                if pat.search(line): bad.append(f"{f.relative_to(src)}:{i}: reads an FSDP_* variable around envknob_get")
for b in bad: print(b)
sys.exit(1 if bad else 0)
PY
source "$(dirname "$0")/lib/job.sh"
tiny_job "$S/job.ini" fsdp.param_dtype=bf16
bad_knob() {  # bad_knob VAR=VALUE EXPECTED: rank 0 of 2 alone; no peer ever comes
  local rdv="$S/rdv-${1%%=*}"
  mkdir "$rdv"
  if env "$1" timeout 30 "$BUILD/fsdp-worker" --standalone --rank 0 --world 2 --rendezvous "$rdv" "$S/job.ini" \
     > /dev/null 2> "$S/err"; then fail "$1 was accepted"; fi
  [ -z "$(ls -A "$rdv")" ] || fail "$1: the worker published rendezvous keys before refusing: $(ls -A "$rdv")"
  [ "$(grep -c ' ERROR ' "$S/err")" = 1 ] || fail "$1: want one error line, got: $(cat "$S/err")"
  grep ' ERROR ' "$S/err" | grep -qF -- "$2" || fail "$1: want '$2', got: $(cat "$S/err")"
}
bad_knob FSDP_CPU_BF16=fast "FSDP_CPU_BF16=fast is not a CPU compute choice; allowed: auto, on, off, emulate"
bad_knob FSDP_CPU_DEVICE=gpu "FSDP_CPU_DEVICE=gpu is not a CPU device mode; allowed: sync, async, strict"
bad_knob FSDP_TRACE=yes "FSDP_TRACE=yes; allowed: 1 (record spans, the default) or 0 (off)"
echo "env_knobs: ok"
