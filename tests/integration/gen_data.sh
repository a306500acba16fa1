#!/usr/bin/env bash
# gen_data — `fsdpctl gen-data` writes a valid llm.c token file of the Markov chain and prints its
# entropy rate; an independent reader (python3 struct) checks the header, and the bigram entropy
# of the tokens matches the printed rate.
# Usage: bash gen_data.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/lib/common.sh" "${1:?usage: gen_data.sh BUILD_DIR SOURCE_DIR}" "${2:?}" gen-data
TMP="$S"
FAIL_LOGS=()

[ -x "$CTL" ] || fail "no fsdpctl at $CTL"
command -v python3 >/dev/null || fail "python3 is needed for the independent reader"

# 1. uint16 file: the printed line, the header, the tokens' entropy.
out=$("$CTL" gen-data --markov 3 --vocab 64 --tokens 200000 -o "$TMP/m.bin")
echo "$out"
[[ "$out" =~ ^wrote\ 200000\ tokens\ to\ .*/m\.bin\;\ entropy\ rate\ ([0-9]+\.[0-9]+)\ nats/token$ ]] \
  || fail "unexpected output: $out"
H=${BASH_REMATCH[1]}
[ ! -e "$TMP/m.bin.tmp" ] || fail "the temporary file was left behind"

python3 - "$TMP/m.bin" 200000 64 "$H" <<'EOF'
import math, struct, sys
path, n, V, H = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
b = open(path, 'rb').read()
hdr = struct.unpack('<256i', b[:1024])
assert hdr[0] == 20240520, f"magic {hdr[0]}"
assert hdr[1] == 1, f"version {hdr[1]}"
assert hdr[2] == n, f"count {hdr[2]}"
assert all(x == 0 for x in hdr[3:]), "header words 3..255 must be 0"
assert len(b) == 1024 + 2 * n, f"size {len(b)}"
t = struct.unpack(f'<{n}H', b[1024:])
assert max(t) < V, f"token {max(t)} >= vocab {V}"
pair, row = {}, [0] * V
for a, c in zip(t, t[1:]):
    pair[(a, c)] = pair.get((a, c), 0) + 1
    row[a] += 1
succ = [0] * V
for (a, c) in pair: succ[a] += 1
he = -sum(k / (n - 1) * math.log(k / row[a]) for (a, c), k in pair.items())
print(f"printed entropy {H:.6f}, bigram estimate {he:.6f}, max successors {max(succ)}")
assert max(succ) <= 4, "at most 4 successors per token"
assert abs(he - H) < 0.01, f"bigram entropy {he} far from the printed {H}"
EOF

# 2. Deterministic: the same seed gives the same bytes, another seed others.
"$CTL" gen-data --markov 3 --vocab 64 --tokens 200000 -o "$TMP/m2.bin" >/dev/null
cmp -s "$TMP/m.bin" "$TMP/m2.bin" || fail "same seed, different files"
"$CTL" gen-data --markov 4 --vocab 64 --tokens 200000 -o "$TMP/m3.bin" >/dev/null
! cmp -s "$TMP/m.bin" "$TMP/m3.bin" || fail "different seeds, same file"

# 3. A vocabulary above 65536 gives the uint32 format; --json carries the same numbers.
js=$("$CTL" gen-data --markov 5 --vocab 70000 --tokens 1000 -o "$TMP/w.bin" --json)
python3 - "$TMP/w.bin" "$js" <<'EOF'
import json, struct, sys
b = open(sys.argv[1], 'rb').read()
j = json.loads(sys.argv[2])
hdr = struct.unpack('<3i', b[:12])
assert hdr == (20240801, 7, 1000), f"header {hdr}"
assert len(b) == 1024 + 4 * 1000
t = struct.unpack('<1000I', b[1024:])
assert max(t) < 70000
assert j["tokens"] == 1000 and j["vocab"] == 70000 and j["seed"] == 5, j
assert 0 < j["entropy_nats"] < 1.3863, j
EOF

# 4. Bad arguments: non-zero exit and a one-line reason.
for args in "--markov 1 --tokens 10" "--markov 1 --tokens 0 -o $TMP/x.bin" \
            "--markov -1 --tokens 10 -o $TMP/x.bin" "--markov 1 --vocab 0 --tokens 10 -o $TMP/x.bin"; do
  # shellcheck disable=SC2086
  if "$CTL" gen-data $args >"$TMP/out" 2>"$TMP/err"; then fail "gen-data $args succeeded"; fi
  grep -q "fsdpctl gen-data:" "$TMP/err" || fail "gen-data $args: no reason on stderr"
done
[ ! -e "$TMP/x.bin" ] || fail "a failed gen-data left a file"
if "$CTL" gen-data --markov 1 --tokens 10 -o "$TMP/no/such/dir/f.bin" 2>"$TMP/err"; then
  fail "writing into a missing directory succeeded"
fi
grep -q "cannot create" "$TMP/err" || fail "no reason for the failed write: $(cat "$TMP/err")"
echo "gen_data: OK"
