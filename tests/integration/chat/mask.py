"""gen-data --chat's tokens and loss mask against transformers.

  python mask.py FSDPCTL TEMPLATE_DIR WORKDIR

A byte-level BPE tokenizer is trained here (tokenizers) with the special tokens chat templates use.
For a ChatML template with {% generation %} blocks, the ids and mask of `fsdpctl gen-data --chat`
must equal transformers' apply_chat_template(tokenize=True, return_assistant_tokens_mask=True);
for published templates without them, the ids must equal apply_chat_template's and the mask an
independent construction: each assistant turn is the characters that rendering the messages up to it
adds to rendering those before it (with the generation prompt), as far as it agrees with the whole
conversation's rendering, mapped to tokens by the fast
tokenizer's offsets (char_to_token). Also: --train-on last and all, {"prompt","completion"} and
{"text"} lines, malformed lines named and counted, --seq-len truncation, and a masked file refused
by the training reader (checked by the caller).
"""
import json
import os
import subprocess
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast
from transformers.utils.chat_template_utils import render_jinja_template

CTL, TDIR, W = sys.argv[1], sys.argv[2], sys.argv[3]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<start_of_turn>", "<end_of_turn>", "<|user|>", "<|assistant|>", "<|end|>", "<|system|>",
            "<s>", "</s>", "<|endoftext|>", "<|im_sep|>"]
CHATML_GEN = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['role'] == 'assistant' %}{% generation %}"
              "{{ m['content'] }}<|im_end|>{% endgeneration %}\n{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CONVS = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."},
     {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another, with emoji."},
     {"role": "assistant", "content": "Red 🔴 — rouge, naïve café."}],
    [{"role": "user", "content": "Grüße! 世界 👩‍👩‍👧"}, {"role": "assistant", "content": "Hallo!\n\nZwei Zeilen."}],
    [{"role": "user", "content": "Empty answer?"}, {"role": "assistant", "content": ""},
     {"role": "user", "content": "  spaces  "}, {"role": "assistant", "content": " ok "}],
    [{"role": "user", "content": "2+3?"}, {"role": "assistant", "content": "5", "reasoning_content": "2 plus 3."}],
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
TOOL_CONV = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "21 C"}, {"role": "assistant", "content": "It is 21 C."}]


def train_tokenizer(path):
    text = [m["content"] for c in CONVS for m in c] * 20 + [
        "The quick brown fox jumps over the lazy dog. system user assistant tool", "Today Date: 26 Jul 2024"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(text, trainers.BpeTrainer(vocab_size=600, special_tokens=SPECIALS,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(path)


def model_dir(name, template):
    d = os.path.join(W, name)
    os.makedirs(d, exist_ok=True)
    train_tokenizer(os.path.join(d, "tokenizer.json"))
    json.dump({"chat_template": template, "bos_token": "<s>", "eos_token": "</s>",
               "tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(d, "tokenizer_config.json"), "w"))
    return d


def read_masked(path):
    raw = open(path, "rb").read()
    hdr = np.frombuffer(raw[:1024], dtype=np.int32)
    assert (hdr[0], hdr[1]) in ((20240520, 2), (20240801, 8)), f"{path}: magic {hdr[0]} version {hdr[1]}"
    n, width = int(hdr[2]), 2 if hdr[0] == 20240520 else 4
    ids = np.frombuffer(raw[1024:1024 + n * width], dtype=np.uint16 if width == 2 else np.uint32).astype(np.int64)
    nb = (n + 7) // 8
    bits = np.unpackbits(np.frombuffer(raw[1024 + n * width:], dtype=np.uint8), bitorder="little")
    assert len(raw) == 1024 + n * width + 2 * nb, f"{path}: size"
    return ids.tolist(), bits[:n].tolist(), bits[8 * nb:8 * nb + n].tolist()


def docs_of(ids, mask, starts):
    at = [i for i, s in enumerate(starts) if s] + [len(ids)]
    return [(ids[a:b], mask[a:b]) for a, b in zip(at, at[1:])]


def gen_data(d, lines, *extra, expect_ok=True):
    src = os.path.join(W, "in.jsonl")
    with open(src, "w", encoding="utf-8") as f:
        for x in lines:
            f.write((x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n")
    out = os.path.join(W, "out.bin")
    p = subprocess.run([CTL, "gen-data", "--chat", src, "--model", d, "-o", out, "--json", *extra],
                       capture_output=True, text=True)
    if expect_ok and p.returncode:
        sys.exit(f"FAIL: gen-data --chat: {p.stderr.strip()}")
    return p, out


def reference_mask(tok, template, msgs, train_last=False, tools=None):
    kw = dict(chat_template=template, bos_token="<s>", eos_token="</s>", tools=tools)
    full = render_jinja_template([msgs], **kw)[0][0]
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        a = render_jinja_template([msgs[:i]], add_generation_prompt=True, **kw)[0][0] if i else ""
        b = render_jinja_template([msgs[:i + 1]], **kw)[0][0]
        common = len(os.path.commonprefix([b, full]))  # a template may close the last message differently
        assert full.startswith(a) and len(a) <= common, "prefix property"
        spans.append((len(a), common))
    if train_last:
        spans = spans[-1:]
    enc = tok(full, add_special_tokens=False)
    mask = [0] * len(enc["input_ids"])
    for s, e in spans:
        if e > s:
            for t in range(enc.char_to_token(s), enc.char_to_token(e - 1) + 1):
                mask[t] = 1
    return enc["input_ids"], mask


def check(name, got, want):
    if got != want:
        sys.exit(f"FAIL: {name}:\n  expected {want}\n  got      {got}")


def main():
    checked = 0
    # 1. {% generation %}: transformers' own assistant mask
    d = model_dir("gen", CHATML_GEN)
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    _, out = gen_data(d, [{"messages": c} for c in CONVS])
    for c, (ids, mask) in zip(CONVS, docs_of(*read_masked(out))):
        r = tok.apply_chat_template(c, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
        check("generation ids", ids, r["input_ids"])
        check("generation mask", mask, r["assistant_masks"])
        checked += 1
    # 2. published templates: the independent construction
    for fname in ["Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                  "microsoft-Phi-3.5-mini-instruct.jinja", "HuggingFaceTB-SmolLM3-3B.jinja",
                  "google-gemma-2-2b-it.jinja", "ibm-granite-granite-3.3-2B-Instruct.jinja"]:
        template = open(os.path.join(TDIR, fname), encoding="utf-8").read()
        d = model_dir(fname.replace(".jinja", ""), template)
        tok = PreTrainedTokenizerFast.from_pretrained(d)
        convs = [c for c in CONVS if not (fname.startswith("google") and c[0]["role"] == "system")]
        for last in (False, True):
            _, out = gen_data(d, [{"messages": c} for c in convs], *(["--train-on", "last"] if last else []))
            docs = docs_of(*read_masked(out))
            check(f"{fname} conversations", len(docs), len(convs))
            for c, (ids, mask) in zip(convs, docs):
                want_ids, want_mask = reference_mask(tok, template, c, last)
                check(f"{fname} ids", ids, want_ids)
                check(f"{fname} mask (last={last})", mask, want_mask)
                checked += 1
    # tool calls, tool results and a line's own tool list
    fname = "Qwen-Qwen2.5-7B-Instruct.jinja"
    template = open(os.path.join(TDIR, fname), encoding="utf-8").read()
    d = os.path.join(W, fname.replace(".jinja", ""))
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    _, out = gen_data(d, [{"messages": TOOL_CONV, "tools": TOOLS}])
    (ids, mask), = docs_of(*read_masked(out))
    want_ids, want_mask = reference_mask(tok, template, TOOL_CONV, tools=TOOLS)
    check("tools ids", ids, want_ids)
    check("tools mask", mask, want_mask)
    checked += 1
    # 3. the other line kinds, --train-on all, malformed lines, --seq-len
    d = os.path.join(W, "gen")
    tok = PreTrainedTokenizerFast.from_pretrained(d)
    lines = [{"prompt": "Hi", "completion": "Hello!"}, {"text": "plain text, all trained"}, "not json",
             {"messages": [{"role": "robot", "content": "x"}]}, {"messages": [{"role": "user", "content": 3}]},
             {"other": 1}, {"messages": CONVS[1]}]
    p, out = gen_data(d, lines, "--train-on", "all")
    summary = json.loads(p.stdout)
    check("counts", (summary["conversations"], summary["malformed"]), (3, 4))
    for n in (3, 4, 5, 6):
        if f"in.jsonl:{n}:" not in p.stderr:
            sys.exit(f"FAIL: malformed line {n} is not named: {p.stderr}")
    docs = docs_of(*read_masked(out))
    check("text line", docs[1][0], tok("plain text, all trained", add_special_tokens=False)["input_ids"])
    check("all trained", [sum(m) == len(m) for _, m in docs], [True] * 3)
    # 30 malformed lines: each named FILE:LINE with a reason, counted, and nothing written for it
    bad = ["{", "[1, 2]", "\"just a string\"", "null", "42", "{\"messages\": []}", "{\"messages\": {}}",
           "{\"messages\": \"hi\"}", "{\"messages\": [1]}", "{\"messages\": [[]]}", "{\"messages\": [{}]}",
           "{\"messages\": [{\"role\": 1, \"content\": \"x\"}]}", "{\"messages\": [{\"role\": \"\", \"content\": \"x\"}]}",
           "{\"messages\": [{\"role\": \"User\", \"content\": \"x\"}]}", "{\"messages\": [{\"role\": \"user\"}]}",
           "{\"messages\": [{\"role\": \"user\", \"content\": null}]}",
           "{\"messages\": [{\"role\": \"user\", \"content\": [\"a\"]}]}",
           "{\"messages\": [{\"role\": \"user\", \"content\": {\"t\": 1}}]}",
           "{\"messages\": [{\"role\": \"user\", \"content\": \"only a question\"}]}",
           "{\"prompt\": \"p\"}", "{\"completion\": \"c\"}", "{\"prompt\": 1, \"completion\": \"c\"}",
           "{\"prompt\": \"p\", \"completion\": null}", "{\"text\": 5}", "{\"text\": null}", "{}",
           "{\"msgs\": []}", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}] trailing",
           "{\"text\": \"\\ud800\"}", "\"\\u0000\""]
    assert len(bad) == 30
    p, out = gen_data(d, bad + [{"messages": CONVS[0]}], "--train-on", "assistant")
    summary = json.loads(p.stdout)
    check("30 malformed counted", (summary["conversations"], summary["malformed"]), (1, 30))
    named = [ln for ln in p.stderr.splitlines() if "in.jsonl:" in ln]
    check("30 malformed named, one line each", sorted(int(ln.split("in.jsonl:")[1].split(":")[0]) for ln in named),
          list(range(1, 31)))
    # --eos: the end-of-text token, not trained, before each conversation
    p, out = gen_data(d, [{"messages": c} for c in CONVS], "--eos")
    eos = tok.convert_tokens_to_ids("</s>")
    check("--eos", [(i[0], m[0]) for i, m in docs_of(*read_masked(out))], [(eos, 0)] * len(CONVS))
    # the output is the same for any number of threads (blocks of 64 lines: 200 lines need several)
    many = [{"messages": CONVS[i % len(CONVS)]} for i in range(200)]
    _, out = gen_data(d, many, "--threads", "1")
    one = open(out, "rb").read()
    _, out = gen_data(d, many, "--threads", "3")
    check("--threads 1 and 3 write the same file", open(out, "rb").read() == one, True)
    # --val: the last conversations, whole
    val = os.path.join(W, "val.bin")
    p, out = gen_data(d, [{"messages": c} for c in CONVS], "--val", val, "--val-fraction", "0.5")
    check("--val split", (len(docs_of(*read_masked(out))), len(docs_of(*read_masked(val)))), (2, 2))
    check("--val conversations", docs_of(*read_masked(val))[1][0],
          tok.apply_chat_template(CONVS[3], tokenize=True, return_dict=True)["input_ids"])
    # a tokenizer whose tokens do not spell bytes (Metaspace, SentencePiece style) is refused once
    sp = os.path.join(W, "sp")
    os.makedirs(sp, exist_ok=True)
    t = Tokenizer(models.BPE(unk_token="<unk>"))
    t.pre_tokenizer = pre_tokenizers.Metaspace()
    t.decoder = decoders.Metaspace()
    t.train_from_iterator(["hello world"] * 5, trainers.BpeTrainer(vocab_size=60, special_tokens=["<unk>"]))
    t.save(os.path.join(sp, "tokenizer.json"))
    json.dump({"chat_template": CHATML_GEN}, open(os.path.join(sp, "tokenizer_config.json"), "w"))
    p, _ = gen_data(sp, [{"messages": CONVS[0]}], expect_ok=False)
    check("not byte-level refused", p.returncode != 0 and "needs a byte-level tokenizer" in p.stderr
          and len(p.stderr.strip().splitlines()) == 1, True)
    p, _ = gen_data(d, lines, "--strict", expect_ok=False)
    check("--strict fails", p.returncode != 0 and "in.jsonl:3:" in p.stderr, True)
    p, out = gen_data(d, [{"messages": c} for c in CONVS], "--seq-len", "8")
    check("truncated", json.loads(p.stdout)["truncated"], 4)
    check("truncated lengths", [len(i) for i, _ in docs_of(*read_masked(out))], [8, 8, 8, 8])
    p, out = gen_data(d, [{"messages": c} for c in CONVS], "--seq-len", "8", "--overlong", "drop", expect_ok=False)
    check("dropped", p.returncode != 0 and "no conversation" in p.stderr, True)
    print(f"{checked} conversations: ids and mask equal to transformers'")


main()
