#!/usr/bin/env bash
# Tokenizing throughput: `fsdpctl gen-data --tokenizer` against Hugging Face `tokenizers`
# (encode_batch_fast, its fastest batch path, on RAYON_NUM_THREADS threads) on the same documents,
# the same tokenizer.json and the same number of threads, in one run.
#   bench/gen_data_tokenizer.sh [BUILD_DIR] [MB] [ROUNDS] [THREADS]
# The text is this machine's: licenses, Debian copyright files and the Python standard library's
# sources, as documents (one per file) joined with a separator that both sides split at, about MB
# megabytes (default 24). Two tokenizers are trained on its first 2 MB: GPT-2's pipeline (ByteLevel)
# and Llama 3's (its Split regex, ByteLevel without regex, ignore_merges), vocabulary 8000. Each side
# runs ROUNDS times (default 3), alternating; the best time counts. fsdpd's wall time is gen-data's
# own ("seconds" of --json: reading the file, splitting and encoding, not writing), its CPU time the
# whole process's (loading the tokenizer and writing included); tokenizers' are encode_batch_fast's
# alone (the text already in memory). CPU time is reported too because a shared machine's wall time
# is noisy. Both token counts must agree.
# Python: the test environment (scripts/test-env.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
. "$here/bench/lib.sh"
bench_conditions_begin "$build"
mb=${2:-24}
rounds=${3:-3}
threads=${4:-$(nproc)}
PY=$(bash "$here/scripts/test-env.sh" --check)
tmp=$(mktemp -d /tmp/fsdp-bench-tok.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
SEP='<<<document>>>\n'

"$PY" - "$tmp" "$mb" <<'PY'
import glob, os, sys, sysconfig
from tokenizers import Tokenizer, Regex, models, pre_tokenizers, decoders, trainers
tmp, mb = sys.argv[1], int(sys.argv[2])
paths = sorted(glob.glob("/usr/share/common-licenses/*")) + sorted(glob.glob("/usr/share/doc/*/copyright")) + \
        sorted(glob.glob(os.path.join(sysconfig.get_paths()["stdlib"], "**/*.py"), recursive=True))
docs, total = [], 0
while total < mb * 1_000_000:
    for p in paths:
        try:
            t = open(p, encoding="utf-8").read()
        except (OSError, UnicodeDecodeError):
            continue
        if "<<<document>>>" in t or not t:
            continue
        docs.append(t); total += len(t.encode())
        if total >= mb * 1_000_000:
            break
open(f"{tmp}/corpus.txt", "w").write("<<<document>>>\n".join(docs))
sample, n = [], 0
for d in docs:
    sample.append(d); n += len(d)
    if n > 2_000_000:
        break
def train(pre, ignore_merges):
    t = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    t.pre_tokenizer = pre
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=8000, special_tokens=["<|endoftext|>"],
                          show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return t
train(pre_tokenizers.ByteLevel(add_prefix_space=False), False).save(f"{tmp}/gpt2.json")
llama3 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
train(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(llama3), behavior="isolated"),
                               pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]), True).save(f"{tmp}/llama3.json")
print(f"corpus: {len(docs)} documents, {total / 1e6:.1f} MB")
PY

cat > "$tmp/hf.py" <<'PY'
import resource, sys, time
from tokenizers import Tokenizer
tok, corpus = Tokenizer.from_file(sys.argv[1]), sys.argv[2]
docs = open(corpus, encoding="utf-8").read().split("<<<document>>>\n")
t0, c0 = time.perf_counter(), time.process_time()
enc = tok.encode_batch_fast(docs, add_special_tokens=False)
print(time.perf_counter() - t0, time.process_time() - c0, sum(len(e.ids) for e in enc))
PY

# One round of both sides, alternating: wall and CPU seconds of each, from one Python driver.
"$PY" - "$tmp" "$build/fsdpctl" "$PY" "$rounds" "$threads" "$SEP" <<'PY'
import json, os, resource, subprocess, sys, tokenizers
tmp, ctl, py, rounds, threads, sep = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]
size = os.path.getsize(f"{tmp}/corpus.txt")
env = dict(os.environ, RAYON_NUM_THREADS=threads, TOKENIZERS_PARALLELISM="true")
print(f"# gen-data --tokenizer against tokenizers {tokenizers.__version__} (encode_batch_fast), {threads} threads, "
      f"{os.cpu_count()} cores online, load average {os.getloadavg()[0]:.1f}")
print(f"# {size / 1e6:.1f} MB; best of {rounds} rounds; MB/s = 1e6 bytes of UTF-8 text per second of wall time,")
print("# cpu MB/s per second of CPU time (user + system: all threads); ratio = fsdpd MB/s / tokenizers MB/s")
print(f"# {'pipeline':<8} {'fsdpd MB/s':>10} {'cpu MB/s':>9} {'tokenizers MB/s':>15} {'cpu MB/s':>9} {'ratio':>6} {'cpu ratio':>9}")
for tk in ["gpt2", "llama3"]:
    fw = fc = hw = hc = float("inf")
    for _ in range(rounds):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        out = subprocess.run([ctl, "gen-data", "--tokenizer", f"{tmp}/{tk}.json", "--text", f"{tmp}/corpus.txt",
                              "--doc-sep", sep, "--threads", threads, "-o", f"{tmp}/out.bin", "--json"],
                             check=True, capture_output=True, text=True).stdout
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        j = json.loads(out)
        fw, fc = min(fw, j["seconds"]), min(fc, r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
        h = subprocess.run([py, f"{tmp}/hf.py", f"{tmp}/{tk}.json", f"{tmp}/corpus.txt"], env=env, check=True,
                           capture_output=True, text=True).stdout.split()
        hw, hc = min(hw, float(h[0])), min(hc, float(h[1]))
        if int(h[2]) != j["tokens"]:
            sys.exit(f"token counts differ: fsdpd {j['tokens']}, tokenizers {h[2]}")
    m = size / 1e6
    print(f"  {tk:<8} {m / fw:10.2f} {m / fc:9.2f} {m / hw:15.2f} {m / hc:9.2f} {hw / fw:6.2f} {hc / fc:9.2f}")
PY
bench_conditions_end
