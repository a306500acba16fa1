"""The Python side of bench/chat_render.sh: conversations rendered, tokenized and masked with Hugging
Face's libraries, on PROCS processes, the way `fsdpctl gen-data --chat` does it (docs/data.md,
"Conversations and chat templates"): each assistant turn is what rendering the messages up to it
adds to rendering those before it with the generation prompt, as far as it agrees with the whole
conversation's rendering; a token is trained when its characters meet a turn's. Renders with
transformers' apply_chat_template (tokenize=False), encodes with tokenizers' Tokenizer.encode (the
fast tokenizer's Rust core, one thread per process), and marks the tokens from the encoding's offsets.

  python chat_render_hf.py gen JSONL MODEL_DIR MB SEED   the conversations and the tokenizer (bench/chat_render.sh)
  python chat_render_hf.py run JSONL MODEL_DIR OUT PROCS render + tokenize + mask; OUT: ids, mask, lengths (.npy)
  python chat_render_hf.py compare OUT FSDPD.bin          every conversation's ids and mask against gen-data's file
"""
import json
import os
import random
import sys

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# ---- gen: a deterministic conversation file ----------------------------------------------------

WORDS = {
    "en": "the of and to in is that for it as with was on be at by this had not are but from or have an they which "
          "one you were her all she there would their we him been has when who will more no if out so said what up "
          "its about into than them can only other new some could time these two may then do first any my now such "
          "like our over man me even most made after also did many before must through back years where much your "
          "way well down should because each just those people how too little state good very make world still own "
          "see men work long get here between both life being under never day same another know while last might "
          "us great old year off come since against go came right used take three model training gradient shard "
          "checkpoint tensor layer batch token attention optimizer learning rate memory device kernel".split(),
    "de": "über größer Straße Mädchen schön früh Grüße müssen Bücher wäre hören Tür Fußball gemütlich Brötchen "
          "Käse Äpfel Öfen Übung weiß heißt draußen".split(),
    "fr": "été déjà où très à côté garçon français naïve café crème élève fenêtre hôpital forêt noël Œuvre "
          "cœur reçu".split(),
    "es": "niño año mañana corazón canción pequeño señor jalapeño acción también está".split(),
    "ru": "привет мир как дела спасибо хорошо сегодня завтра книга город модель данные обучение".split(),
    "el": "καλημέρα ευχαριστώ θάλασσα ήλιος λόγος μάθηση".split(),
    "zh": "你好 世界 训练 模型 数据 今天 天气 很好 我们 学习 中文 分布式 检查点".split(),
    "ja": "こんにちは ありがとう 東京 日本語 学習 カタカナ ひらがな データ モデル".split(),
    "ko": "안녕하세요 감사합니다 한국어 학습 데이터".split(),
    "ar": "مرحبا شكرا العالم البيانات".split(),
    "emoji": "😀 🎉 🚀 ❤️ 👍 🔥 👩‍💻 🇫🇷 ✅ 🤖 ☕".split(),
}
LANG_WEIGHTS = [("en", 70), ("de", 5), ("fr", 5), ("es", 4), ("ru", 4), ("el", 2), ("zh", 4), ("ja", 2),
                ("ko", 1), ("ar", 1), ("emoji", 2)]
SYSTEMS = ["You are a helpful assistant.", "You are terse. Answer in one sentence.",
           "Réponds en français, s'il te plaît.", "Du bist ein freundlicher Assistent für Grüße und Straßen.",
           "你是一个乐于助人的助手。", "You explain distributed training: FSDP, ZeRO-3, shards and checkpoints.",
           "Answer as a pirate would 🏴‍☠️, but keep the facts right.", ""]


SYLLABLES = "ka ri to mo ne sa lu vi qu en ar st pl ght ion tre bla ck sch ung ver zu".split()


def word(rng, lang):
    if lang == "en" and rng.random() < 0.25:   # a word of no dictionary: the tokenizer must split it
        return "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
    return rng.choice(WORDS[lang])


def sentence(rng, n):
    langs = rng.choices([l for l, _ in LANG_WEIGHTS], [w for _, w in LANG_WEIGHTS], k=n)
    words = [word(rng, l) for l in langs]
    words[0] = words[0][:1].upper() + words[0][1:]
    return " ".join(words) + rng.choice([".", "?", "!", "…", ":", "."])


def content(rng, long):
    parts = []
    for _ in range(rng.randint(1, 4 if long else 2)):
        kind = rng.random()
        if kind < 0.7:
            parts.append(" ".join(sentence(rng, rng.randint(3, 25)) for _ in range(rng.randint(1, 4))))
        elif kind < 0.85:
            parts.append("\n".join(f"- {sentence(rng, rng.randint(2, 8))}" for _ in range(rng.randint(2, 5))))
        else:
            name = rng.choice(WORDS["en"])
            parts.append(f"```python\ndef {name}(x):\n    return {{\"{name}\": x * {rng.randint(2, 99)}}}\n```")
    text = "\n\n".join(parts)
    return ("  " + text + " ") if rng.random() < 0.03 else text   # surrounding whitespace, now and then


def conversation(rng):
    if rng.random() < 0.05:
        return {"prompt": content(rng, False), "completion": content(rng, True)}
    msgs = []
    if rng.random() < 0.6:
        s = rng.choice(SYSTEMS)
        msgs.append({"role": "system", "content": s if s else sentence(rng, rng.randint(5, 30))})
    for _ in range(min(1 + int(rng.expovariate(0.45)), 12)):   # 1 exchange most often, up to 12
        msgs.append({"role": "user", "content": content(rng, False)})
        msgs.append({"role": "assistant", "content": "" if rng.random() < 0.01 else content(rng, True)})
    return {"messages": msgs}


def gen(path, model_dir, mb, seed):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    rng = random.Random(seed)
    size, n, sample = 0, 0, []
    with open(path, "w", encoding="utf-8") as f:
        while size < mb * 1_000_000:
            line = json.dumps(conversation(rng), ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
            n += 1
            if len(sample) < 4000:
                sample.append(line)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    texts = [m["content"] for l in sample for m in json.loads(l).get("messages", [])] + SYSTEMS
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=8000, special_tokens=SPECIALS, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    os.makedirs(model_dir, exist_ok=True)
    tok.save(os.path.join(model_dir, "tokenizer.json"))
    template = open(os.environ["CHAT_TEMPLATE"], encoding="utf-8").read()
    json.dump({"chat_template": template, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
               "tokenizer_class": "PreTrainedTokenizerFast"}, open(os.path.join(model_dir, "tokenizer_config.json"), "w"))
    print(f"{n} conversations, {size / 1e6:.1f} MB, tokenizer of {tok.get_vocab_size()} tokens")


# ---- run: render + tokenize + mask on PROCS processes -------------------------------------------

_tok = _enc = None


def _init(model_dir):
    global _tok, _enc
    os.environ["TOKENIZERS_PARALLELISM"] = "false"   # one thread per process: the processes are the cores
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    _tok = PreTrainedTokenizerFast.from_pretrained(model_dir)
    _enc = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


def _one(line):
    import numpy as np
    d = json.loads(line)
    msgs = d.get("messages") or [{"role": "user", "content": d["prompt"]}, {"role": "assistant", "content": d["completion"]}]
    full = _tok.apply_chat_template(msgs, tokenize=False)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        a = _tok.apply_chat_template(msgs[:i], tokenize=False, add_generation_prompt=True) if i else ""
        b = _tok.apply_chat_template(msgs[:i + 1], tokenize=False)
        common = len(os.path.commonprefix([b, full]))
        if not (full.startswith(a) and len(a) <= common):
            raise ValueError("the template rewrites earlier turns: not maskable by prefixes")
        spans.append((len(a), common))
    e = _enc.encode(full, add_special_tokens=False)
    off = np.asarray(e.offsets, dtype=np.int64).reshape(-1, 2)
    mask = np.zeros(len(off), dtype=np.uint8)
    for s, t in spans:
        mask |= ((off[:, 0] < t) & (off[:, 1] > s)).astype(np.uint8)
    return np.asarray(e.ids, dtype=np.uint32), mask


def _chunk(lines):
    import numpy as np
    out = [_one(l) for l in lines]
    return (np.concatenate([i for i, _ in out]), np.concatenate([m for _, m in out]),
            np.asarray([len(i) for i, _ in out], dtype=np.int64))


def run(path, model_dir, out, procs):
    import multiprocessing as mp
    import numpy as np
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    chunks = [lines[i:i + 64] for i in range(0, len(lines), 64)]   # gen-data's block of lines, too
    with mp.get_context("fork").Pool(procs, initializer=_init, initargs=(model_dir,)) as pool:
        res = pool.map(_chunk, chunks, chunksize=4)
    ids = np.concatenate([r[0] for r in res])
    np.save(out + ".ids.npy", ids)
    np.save(out + ".mask.npy", np.concatenate([r[1] for r in res]))
    np.save(out + ".len.npy", np.concatenate([r[2] for r in res]))
    print(f"{len(lines)} conversations, {len(ids)} tokens")


# ---- compare: every conversation against gen-data's masked file ---------------------------------

def compare(out, fsdpd_bin):
    import numpy as np
    raw = np.fromfile(fsdpd_bin, dtype=np.uint8)
    hdr = raw[:1024].view(np.int32)
    n, width = int(hdr[2]), 2 if hdr[0] == 20240520 else 4
    ids = raw[1024:1024 + n * width].view(np.uint16 if width == 2 else np.uint32).astype(np.uint32)
    nb = (n + 7) // 8
    bits = np.unpackbits(raw[1024 + n * width:], bitorder="little")
    mask, starts = bits[:n], bits[8 * nb:8 * nb + n]
    rids, rmask, rlen = np.load(out + ".ids.npy"), np.load(out + ".mask.npy"), np.load(out + ".len.npy")
    rstarts = np.zeros(len(rids), dtype=np.uint8)
    rstarts[np.concatenate([[0], np.cumsum(rlen)[:-1]])] = 1
    if len(rids) != n or not np.array_equal(starts, rstarts):
        at = np.flatnonzero(starts)
        print(f"ids differ: {n} tokens in {len(at)} conversations against {len(rids)} in {len(rlen)}")
        return 1
    bounds = np.concatenate([np.cumsum(rlen) - rlen, [n]])
    bad = sorted({int(np.searchsorted(bounds, i, side="right") - 1)
                  for i in np.flatnonzero((ids != rids) | (mask != rmask))[:100000]})
    if bad:
        print(f"{len(bad)} of {len(rlen)} conversations differ (ids or mask), the first: line {bad[0] + 1}")
        return 1
    print(f"ids and mask equal: {len(rlen)} conversations, {n} tokens ({int(mask.sum())} trained)")
    return 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "gen":
        gen(sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5]))
    elif cmd == "run":
        run(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(compare(sys.argv[2], sys.argv[3]))
