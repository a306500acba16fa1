#!/usr/bin/env bash
# gen_data — `fsdpctl gen-data` writes a valid llm.c token file of the Markov chain and prints its
# entropy rate; an independent reader (python3 struct) checks the header, and the bigram entropy
# of the tokens matches the printed rate. `gen-data --text` turns text files into byte-level tokens
# (checked byte for byte by the same reader), splits off a validation tail, refuses bad input with
# one line, and its output trains (two steps of a standalone run).
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
# 5. --text: byte-level tokens of the files in the order given, the validation tail, counts printed.
printf 'To be, or not to be, that is the question:\n' >"$TMP/a.txt"
printf 'caf\xc3\xa9 \x00\xff and more\n' >"$TMP/b.txt"        # UTF-8, NUL and 0xff are tokens too
python3 -c 'import sys; sys.stdout.write("".join(chr(97 + i % 26) for i in range(1000)))' >"$TMP/c.txt"
out=$("$CTL" gen-data --text "$TMP/a.txt" "$TMP/b.txt" -o "$TMP/t.bin")
echo "$out"
na=$(stat -c %s "$TMP/a.txt") nb=$(stat -c %s "$TMP/b.txt")
[ "$out" = "wrote $((na + nb)) tokens to $TMP/t.bin (byte-level, vocab 256)" ] || fail "unexpected output: $out"
"$CTL" gen-data --text "$TMP/a.txt" --text "$TMP/b.txt" -o "$TMP/t2.bin" >/dev/null
cmp -s "$TMP/t.bin" "$TMP/t2.bin" || fail "--text a b and --text a --text b differ"
"$CTL" gen-data --text "$TMP/b.txt" "$TMP/a.txt" -o "$TMP/t3.bin" >/dev/null
! cmp -s "$TMP/t.bin" "$TMP/t3.bin" || fail "the order of the text files is ignored"
out=$("$CTL" gen-data --text "$TMP/a.txt" "$TMP/c.txt" -o "$TMP/tr.bin" --val "$TMP/va.bin" --val-fraction 0.25)
echo "$out"
nc=$(stat -c %s "$TMP/c.txt")
total=$((na + nc)) nval=$(( (na + nc) / 4 ))
[ "$out" = "wrote $((total - nval)) tokens to $TMP/tr.bin and $nval validation tokens to $TMP/va.bin (byte-level, vocab 256)" ] \
  || fail "unexpected output: $out"
js=$("$CTL" gen-data --text "$TMP/a.txt" "$TMP/c.txt" -o "$TMP/tr2.bin" --val "$TMP/va2.bin" --val-fraction 0.25 --json)
python3 - "$TMP" "$js" <<'EOF2'
import json, struct, sys
d = sys.argv[1]
def tokens(path):
    b = open(path, 'rb').read()
    hdr = struct.unpack('<256i', b[:1024])
    assert hdr[:3] == (20240520, 1, (len(b) - 1024) // 2), f"{path}: header {hdr[:3]}, size {len(b)}"
    assert all(x == 0 for x in hdr[3:]) and len(b) == 1024 + 2 * hdr[2], path
    return list(struct.unpack(f'<{hdr[2]}H', b[1024:]))
a, b, c = (open(f'{d}/{n}.txt', 'rb').read() for n in 'abc')
assert tokens(f'{d}/t.bin') == list(a + b), "tokens are not the bytes of a.txt then b.txt"
assert tokens(f'{d}/t3.bin') == list(b + a)
text = a + c
n_val = len(text) // 4
assert tokens(f'{d}/tr.bin') == list(text[:-n_val]), "the training file is not the head of the text"
assert tokens(f'{d}/va.bin') == list(text[-n_val:]), "the validation file is not the tail of the text"
assert open(f'{d}/tr.bin', 'rb').read() == open(f'{d}/tr2.bin', 'rb').read()
j = json.loads(sys.argv[2])
assert j == {"path": f"{d}/tr2.bin", "tokens": len(text) - n_val, "vocab": 256, "files": 2,
             "val_path": f"{d}/va2.bin", "val_tokens": n_val}, j
print("text tokens: byte for byte, head and tail")
EOF2

# 6. Bad --text input: exit 1 or 2, a reason naming the problem on the first stderr line, no file.
: >"$TMP/empty.txt"
mkdir -p "$TMP/adir"
printf 'x' >"$TMP/one.txt"
check_bad() {  # check_bad EXPECTED_TEXT ARGS...
  local want=$1
  shift
  if "$CTL" gen-data "$@" >"$TMP/out" 2>"$TMP/err"; then fail "gen-data $* succeeded"; fi
  head -n 1 "$TMP/err" | grep "^fsdpctl gen-data: " | grep -qF -e "$want" \
    || fail "gen-data $*: want '$want' first, got: $(cat "$TMP/err")"
  [ ! -e "$TMP/bad.bin" ] && [ ! -e "$TMP/badv.bin" ] || fail "gen-data $* left a file"
}
check_bad "text file $TMP/empty.txt is empty" --text "$TMP/a.txt" "$TMP/empty.txt" -o "$TMP/bad.bin"
check_bad "cannot read text file $TMP/nope.txt: No such file" --text "$TMP/nope.txt" -o "$TMP/bad.bin"
check_bad "text file $TMP/adir is not a regular file" --text "$TMP/adir" -o "$TMP/bad.bin"
for f in 0 1 1.5 -0.1 abc nan; do
  check_bad "--val-fraction '$f': expected a number > 0 and < 1" --text "$TMP/a.txt" -o "$TMP/bad.bin" \
    --val "$TMP/badv.bin" --val-fraction "$f"
done
check_bad "--val OUT_VAL.bin and --val-fraction F go together" --text "$TMP/a.txt" -o "$TMP/bad.bin" --val "$TMP/badv.bin"
check_bad "--val OUT_VAL.bin and --val-fraction F go together" --text "$TMP/a.txt" -o "$TMP/bad.bin" --val-fraction 0.1
check_bad "--val and --val-fraction split text" --markov 1 --tokens 10 -o "$TMP/bad.bin" --val "$TMP/badv.bin" --val-fraction 0.1
check_bad "--text makes tokens of text" --text "$TMP/a.txt" --vocab 300 -o "$TMP/bad.bin"
check_bad "--text FILE... needs -o OUT.bin" --text "$TMP/a.txt"
check_bad "--val and -o name the same file" --text "$TMP/a.txt" -o "$TMP/bad.bin" --val "$TMP/bad.bin" --val-fraction 0.5
check_bad "unexpected argument" "$TMP/a.txt" --markov 1 --tokens 10 -o "$TMP/bad.bin"
check_bad "the text is 1 token long; a validation split needs at least 2" --text "$TMP/one.txt" \
  -o "$TMP/bad.bin" --val "$TMP/badv.bin" --val-fraction 0.5
check_bad "--val-fraction 0.01 of $na tokens leaves the validation tail empty; use a fraction of at least" \
  --text "$TMP/a.txt" -o "$TMP/bad.bin" --val "$TMP/badv.bin" --val-fraction 0.01
check_bad "cannot create $TMP/no/dir/v.bin: $TMP/no does not exist" --text "$TMP/a.txt" "$TMP/c.txt" -o "$TMP/bad.bin" \
  --val "$TMP/no/dir/v.bin" --val-fraction 0.5

# 7. The tokens train: two steps of a byte-level GPT-2 on 2 standalone ranks, from the text file.
for i in 1 2 3 4 5 6 7 8; do cat "$TMP/a.txt" "$TMP/c.txt"; done >"$TMP/big.txt"
"$CTL" gen-data --text "$TMP/big.txt" -o "$TMP/train.bin" >/dev/null
source "$(dirname "$0")/lib/job.sh"
tiny_job "$TMP/job.ini" job.steps=2 model.vocab_size=256 model.seq_len=32 data.train=train.bin data.batch_size=2 \
  fsdp.timeout_s=30
FSDP_WORKER="$BUILD/fsdp-worker" FSDP_OUT="$TMP/run" timeout 120 \
  "${2:?usage: gen_data.sh BUILD_DIR SOURCE_DIR}/scripts/launch-standalone.sh" 2 "$TMP/job.ini" >/dev/null \
  || fail "training on the text tokens failed: $(cat "$TMP"/run/rank-*.log 2>/dev/null | tail -n 5)"
python3 - "$TMP/run/rank-0.jsonl" <<'EOF2' || fail "rank 0's output: $(tail -n 3 "$TMP/run/rank-0.jsonl")"
import json, math, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert [l["step"] for l in lines] == [1, 2], lines
assert all(math.isfinite(l["loss"]) and 0 < l["loss"] < 10 for l in lines), lines
print(f"trained on the text tokens: loss {lines[0]['loss']:.4f}, {lines[1]['loss']:.4f}")
EOF2
echo "gen_data: OK"
