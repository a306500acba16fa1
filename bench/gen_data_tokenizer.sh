#!/usr/bin/env bash
# Tokenizing throughput: `fsdpctl gen-data --tokenizer` against Hugging Face `tokenizers`
# (encode_batch and encode_batch_fast, on RAYON_NUM_THREADS threads) on the same documents, the same
# tokenizer.json and the same number of threads, in one run, and the ids compared, not only counted.
#   bench/gen_data_tokenizer.sh [BUILD_DIR] [CODE_MB] [ROUNDS] [THREADS]     env: VOCAB (8000)
# Two corpora of this machine's text, each document one file, joined with a separator both sides
# split at, no duplicate: a file is left out when a quarter of its paragraphs (whitespace-normalized)
# were already taken, which drops the Debian copyright files that repeat a license:
#   prose  English documents of 2-20 KB: /usr/share/common-licenses and /usr/share/doc's plain text
#          files (at least 80 % letters and spaces), all there are;
#   code   the Python standard library's sources and /usr/include's C headers, about CODE_MB MB (4).
# Their composition (documents, sizes, sources) is printed. A tokenizer is trained on a 2 MB sample
# of both for each of GPT-2's pipeline (ByteLevel) and Llama 3's (its Split regex, ByteLevel without
# regex, ignore_merges), vocabulary VOCAB. Each side runs ROUNDS times (default 3), alternating; the
# best time counts. fsdpd's wall time is gen-data's own ("seconds" of --json: reading the file,
# splitting and encoding, not writing), its CPU time the whole process's (loading the tokenizer and
# writing included); tokenizers' are the encode call's alone (the text already in memory). Every
# round's ids must equal gen-data's token file, both encode calls'.
# Python: the test environment (scripts/test-env.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
. "$here/bench/lib.sh"
bench_conditions_begin "$build"
mb=${2:-4}
rounds=${3:-3}
threads=${4:-$(nproc)}
PY=$(bash "$here/scripts/test-env.sh" --check)
tmp=$(mktemp -d /tmp/fsdp-bench-tok.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
SEP='<<<document>>>\n'

"$PY" - "$tmp" "$mb" "${VOCAB:-8000}" <<'PY'
import glob, hashlib, os, re, sys, sysconfig
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
tmp, mb, vocab = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seen = set()
def unique(t):   # no duplicate: at most a quarter of the paragraphs seen before
    hs = [hashlib.sha1(re.sub(r"\s+", " ", p).strip().encode()).digest() for p in re.split(r"\n\s*\n", t) if p.strip()]
    if not hs or sum(h in seen for h in hs) * 4 > len(hs): return False
    seen.update(hs); return True
def read(p):
    try: t = open(p, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError): return None
    return t if t and "<<<document>>>" not in t else None
prose, code, srcs = [], [], {"prose": {}, "code": {}}
for p in sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/**/*", recursive=True)):
    if not os.path.isfile(p) or os.path.islink(p) or not 2000 <= os.path.getsize(p) <= 20000: continue
    if re.search(r"\.(gz|bz2|xz|html?|png|svg|js|css|py|c|h|json|xml)$", p): continue
    t = read(p)
    if t is None or sum(c.isalpha() or c == " " for c in t) < 0.8 * len(t) or not unique(t): continue
    prose.append(t); k = "licenses" if "common-licenses" in p else "doc"; srcs["prose"][k] = srcs["prose"].get(k, 0) + 1
total = 0
for p in sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**/*.py"), recursive=True)) + \
         sorted(glob.glob("/usr/include/**/*.h", recursive=True)):
    if total >= mb * 1_000_000: break
    t = read(p)
    if t is None or not unique(t): continue
    code.append(t); total += len(t.encode()); k = "python" if p.endswith(".py") else "c"
    srcs["code"][k] = srcs["code"].get(k, 0) + 1
for name, docs in (("prose", prose), ("code", code)):
    open(f"{tmp}/{name}.txt", "w").write("<<<document>>>\n".join(docs))
    sz = sorted(len(d.encode()) for d in docs)
    print(f"corpus {name}: {len(docs)} documents, {sum(sz) / 1e6:.2f} MB, document sizes {sz[0]}..{sz[-1]} B "
          f"(median {sz[len(sz) // 2]}), from {', '.join(f'{k} {v}' for k, v in srcs[name].items())}, no duplicate")
sample, n = [], 0
for a, b in zip(prose, code):
    sample += [a, b]; n += len(a) + len(b)
    if n > 2_000_000: break
def train(pre, ignore_merges):
    t = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    t.pre_tokenizer = pre
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                          show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t
train(pre_tokenizers.ByteLevel(add_prefix_space=False), False).save(f"{tmp}/gpt2.json")
llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
train(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(llama3), behavior="isolated"),
                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True).save(f"{tmp}/llama3.json")
print(f"tokenizers trained on {n / 1e6:.1f} MB of both, vocabulary {vocab}")
PY

cat > "$tmp/hf.py" <<'PY'
import array, sys, time
from tokenizers import Tokenizer
tok, corpus, call, out = Tokenizer.from_file(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
docs = open(corpus, encoding="utf-8").read().split("<<<document>>>\n")
f = getattr(tok, call)
t0, c0 = time.perf_counter(), time.process_time()
enc = f(docs, add_special_tokens=False)
t1, c1 = time.perf_counter() - t0, time.process_time() - c0
ids = array.array("I", (x for e in enc for x in e.ids))
open(out, "wb").write(ids.tobytes())
print(t1, c1, len(ids))
PY

# Rounds of all three, alternating: wall and CPU seconds of each, from one Python driver.
"$PY" - "$tmp" "$build/fsdpctl" "$PY" "$rounds" "$threads" "$SEP" <<'PY'
import array, json, os, resource, subprocess, sys, tokenizers
tmp, ctl, py, rounds, threads, sep = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
env = dict(os.environ, RAYON_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="true")
calls = ("encode_batch", "encode_batch_fast")
print(f"# gen-data --tokenizer against tokenizers {tokenizers.__version__}, {threads} threads; best of {rounds} rounds; "
      "MB/s = 1e6 bytes of UTF-8 text per second of wall time,")
print("# cpu MB/s per second of CPU time (user + system: all threads); ratio = fsdpd MB/s / tokenizers MB/s")
print(f"# {'corpus':<6} {'pipeline':<8} {'fsdpd MB/s':>10} {'cpu':>7} {'batch MB/s':>10} {'cpu':>7} {'ratio':>6} "
      f"{'fast MB/s':>9} {'cpu':>7} {'ratio':>6} {'cpu ratio':>9} ids")
def fsdpd_ids(path):
    b = open(path, "rb").read()
    hdr = array.array("i", b[:1024])
    ids = array.array("H" if hdr[0] == 20240520 else "I", b[1024:])
    return list(ids[:hdr[2]])
for corpus in ("prose", "code"):
    text = f"{tmp}/{corpus}.txt"
    size = os.path.getsize(text)
    for tk in ("gpt2", "llama3"):
        best = {k: [float("inf"), float("inf")] for k in ("fsdpd",) + calls}
        same = 0
        for _ in range(rounds):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            out = subprocess.run([ctl, "gen-data", "--tokenizer", f"{tmp}/{tk}.json", "--text", text, "--doc-sep", sep,
                                  "--threads", threads, "-o", f"{tmp}/out.bin", "--json"],
                                 check=True, capture_output=True, text=True).stdout
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            j = json.loads(out)
            b = best["fsdpd"]
            b[0], b[1] = min(b[0], j["seconds"]), min(b[1], r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
            want = fsdpd_ids(f"{tmp}/out.bin")
            for call in calls:
                h = subprocess.run([py, f"{tmp}/hf.py", f"{tmp}/{tk}.json", text, call, f"{tmp}/hf.ids"], env=env,
                                   check=True, capture_output=True, text=True).stdout.split()
                b = best[call]
                b[0], b[1] = min(b[0], float(h[0])), min(b[1], float(h[1]))
                got = list(array.array("I", open(f"{tmp}/hf.ids", "rb").read()))
                if got != want:
                    k = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
                    sys.exit(f"ids differ ({corpus}, {tk}, {call}): {len(want)} from fsdpd, {len(got)} from tokenizers, "
                             f"first difference at {k}")
                same += 1
        m = size / 1e6
        f, bb, ff = best["fsdpd"], best["encode_batch"], best["encode_batch_fast"]
        print(f"  {corpus:<6} {tk:<8} {m / f[0]:10.2f} {m / f[1]:7.2f} {m / bb[0]:10.2f} {m / bb[1]:7.2f} {bb[0] / f[0]:6.2f} "
              f"{m / ff[0]:9.2f} {m / ff[1]:7.2f} {ff[0] / f[0]:6.2f} {ff[1] / f[1]:9.2f} {same}/{2 * rounds} equal", flush=True)
PY
bench_conditions_end
