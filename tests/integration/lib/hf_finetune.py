# The transformers side of hf_finetune.sh (run with scripts/test-env.sh's python: torch, transformers 5).
#   hf_finetune.py build DIR   tiny model folders saved by save_pretrained, with sharpened attention and
#                              a strong head so that their loss depends on positions (and on the tie), the
#                              token file, and DIR/refs.json: each model's step-1 loss on the job's first
#                              rows, and the same loss with the feature turned off (the controls)
#   hf_finetune.py verify DIR  every export loads with AutoModelForCausalLM and AutoTokenizer; its logits
#                              equal fsdpd's (DIR/logits-*.json); tied stays tied; bf16 stays bf16
import copy, json, math, os, struct, sys

import torch
from safetensors import safe_open
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import (AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                          LlamaForCausalLM, PreTrainedTokenizerFast)

V, BLOCK, ROWS = 256, 32, 4        # vocabulary (bytes), copy-task block, step-1 rows (world 2 x batch 2)
LO, HI = 32, 96                    # the task's tokens: printable ASCII, so that a prompt is plain text
RTOL = 1e-5
torch.set_num_threads(1)           # the test shares two busy cores; more threads only contend


def byte_chars():
    """Byte b -> the printable character ByteLevel pre-tokenization maps it to (GPT-2's scheme)."""
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def save_tokenizer(d):
    """A byte-level tokenizer whose ids are the byte values (fsdpd's prompts are bytes)."""
    vocab = {c: b for b, c in byte_chars().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    PreTrainedTokenizerFast(tokenizer_object=tok).save_pretrained(d)


def stream(n_blocks, seed):
    """Blocks of BLOCK tokens: a random half, then the same half again (copying needs positions)."""
    g = torch.Generator().manual_seed(seed)
    half = torch.randint(LO, HI, (n_blocks, BLOCK // 2), generator=g)
    return torch.cat([half, half], 1).reshape(-1)


def rows(toks, T, n, first=0):
    x = torch.stack([toks[(first + r) * T:(first + r) * T + T] for r in range(n)])
    y = torch.stack([toks[(first + r) * T + 1:(first + r) * T + T + 1] for r in range(n)])
    return x, y


def loss_of(model, x, y):
    with torch.no_grad():
        lg = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1)).item()


def sharpen(model, qk=16.0, head=20.0):
    """Queries and keys scaled by QK: peaked attention whose weights depend strongly on positions (the
    rotary phases, GPT-2's wpe); the head (and so a tied embedding) by HEAD: logits of a few units, so
    the loss follows what the model computes (a tiny random model otherwise gives about ln V whatever
    its rope or tie). No training is needed for that, which keeps the test fast."""
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                w.mul_(qk)
            elif name.endswith("c_attn.weight"):
                w[:, :2 * w.shape[0]].mul_(qk)
            elif name.endswith(("lm_head.weight", "wte.weight")) or (name.endswith("embed_tokens.weight") and
                                                                     model.config.tie_word_embeddings):
                w.mul_(head)
            elif name.endswith("wpe.weight"):
                w.mul_(head)   # positions as strong as the (scaled) token embeddings
    model.eval()
    return model


def llama(**kw):
    base = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1,
                eos_token_id=2, pad_token_id=0, rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    base.update(kw)
    return LlamaConfig(**base)


# name: (config, T, save_pretrained kwargs, how the model is saved)
KINDS = {
    "gpt2": (lambda: GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4, bos_token_id=1,
                                eos_token_id=2), 32, {}),
    "llama_gqa": (lambda: llama(), 32, {}),
    "llama_tied": (lambda: llama(tie_word_embeddings=True, num_key_value_heads=4), 32, {}),
    "llama_sharded": (lambda: llama(), 32, {"max_shard_size": "12KB"}),
    # head size 16, theta 500000, original 64 / factor 8: frequencies in all three of llama3's bands
    # (wavelengths below 64/4 = 16, between 16 and 64, above 64); T = 64 >= 2 x 64 / 8
    "llama_rope3": (lambda: llama(hidden_size=64, max_position_embeddings=512, rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}), 64, {}),
    "llama_bf16": (lambda: llama(), 32, {}),
}


def controls(name, model, d, x, y):
    """The loss with the feature fsdpd must honour turned off: it must differ from the real one."""
    cfg = copy.deepcopy(model.config)
    out = {}
    if name == "llama_gqa":
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
        out["theta 10000 for 500000"] = loss_of(LlamaForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32), x, y)
    if name == "llama_rope3":
        cfg.rope_parameters = {"rope_type": "default", "rope_theta": 500000.0}
        out["unscaled rope"] = loss_of(LlamaForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32), x, y)
    if name == "llama_tied":
        cfg.tie_word_embeddings = False
        m = LlamaForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32)   # lm_head: newly initialized
        out["untied head"] = loss_of(m, x, y)
    if name == "gpt2":
        m = GPT2LMHeadModel.from_pretrained(d, dtype=torch.float32)
        with torch.no_grad():
            m.transformer.wpe.weight.copy_(m.transformer.wpe.weight.flip(0))   # the positions reversed
        out["positions reversed"] = loss_of(m, x, y)
    return out


def llama3_bands(cfg):
    """How many rotary frequencies fall in each of llama3's bands: kept (wavelength below original /
    high_freq_factor), blended (between), scaled (above original / low_freq_factor)."""
    rp, hs = cfg.rope_parameters, cfg.hidden_size // cfg.num_attention_heads
    orig = rp["original_max_position_embeddings"]
    waves = [2 * math.pi * rp["rope_theta"] ** (2 * i / hs) for i in range(hs // 2)]
    lo, hi = orig / rp["high_freq_factor"], orig / rp["low_freq_factor"]
    return [sum(w < lo for w in waves), sum(lo <= w <= hi for w in waves), sum(w > hi for w in waves)]


def build(root):
    torch.manual_seed(0)
    toks = stream(256, 7)
    raw = toks.tolist()
    with open(f"{root}/train.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(raw), *[0] * 253) + struct.pack(f"<{len(raw)}H", *raw))
    refs = {}
    for name, (mk, T, kw) in KINDS.items():
        torch.manual_seed(1)
        cfg = mk()
        model = sharpen((GPT2LMHeadModel if name == "gpt2" else LlamaForCausalLM)(cfg))
        d = f"{root}/{name}"
        if name == "llama_bf16":
            model = model.to(torch.bfloat16)
        model.save_pretrained(d, **kw)
        save_tokenizer(d)
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        if name == "llama_rope3":   # every band used, at T >= 2 x original / factor
            rp = cfg.rope_parameters
            assert min(llama3_bands(cfg)) > 0 and T >= 2 * rp["original_max_position_embeddings"] / rp["factor"]
        x, y = rows(toks, T, ROWS)
        px, _ = rows(toks, T, 1, 5)
        refs[name] = {"T": T, "loss": loss_of(ref, x, y), "lnV": math.log(V), "controls": controls(name, ref, d, x, y),
                      "prompt": bytes(px[0].tolist()).decode("ascii"),
                      "files": sorted(f for f in os.listdir(d) if f.endswith(".safetensors"))}
    json.dump(refs, open(f"{root}/refs.json", "w"), indent=1)


def close(a, b):
    """max |a - b| within RTOL of the largest |b|."""
    a, b = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    return a.shape == b.shape and (a - b).abs().max().item() <= RTOL * b.abs().max().item(), (a - b).abs().max().item()


def verify(root):
    refs, bad = json.load(open(f"{root}/refs.json")), []
    for name, r in refs.items():
        exp = f"{root}/exp_{name}"
        if not os.path.isdir(exp):
            continue
        model = AutoModelForCausalLM.from_pretrained(exp, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(exp)
        ids = tok(r["prompt"], add_special_tokens=False)["input_ids"]
        if ids != list(r["prompt"].encode()):
            bad.append(f"{name}: the exported tokenizer encodes the prompt as {ids[:8]}...")
        with torch.no_grad():
            hf = model(input_ids=torch.tensor([ids])).logits[0].tolist()
        for src in ("ckpt", "export"):
            f = f"{root}/logits-{name}-{src}.json"
            if os.path.exists(f):
                ok, diff = close(json.load(open(f)), hf)
                print(f"{name}: logits of fsdpd ({src}) vs transformers on the export: max |diff| {diff:.2e}")
                if not ok:
                    bad.append(f"{name}: fsdpd's logits ({src}) differ from transformers' by {diff:.3g}")
        cfg = json.load(open(f"{exp}/config.json"))
        src_cfg = json.load(open(f"{root}/{name}/config.json"))
        for k in ("bos_token_id", "eos_token_id", "pad_token_id", "max_position_embeddings", "n_positions",
                  "tie_word_embeddings", "rope_parameters", "transformers_version"):
            if src_cfg.get(k) != cfg.get(k):
                bad.append(f"{name}: config.json {k} = {cfg.get(k)!r}, the source's {src_cfg.get(k)!r}")
        names, dtypes, data = set(), set(), 0
        for fn in os.listdir(exp):
            if fn.endswith(".safetensors"):
                with safe_open(f"{exp}/{fn}", "pt") as sf:
                    for k in sf.keys():
                        t = sf.get_tensor(k)
                        names.add(k)
                        dtypes.add(str(t.dtype))
                        data += t.numel() * t.element_size()
        if name == "llama_tied":
            if "lm_head.weight" in names or not cfg.get("tie_word_embeddings") or \
                    model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
                bad.append(f"{name}: the export is not tied (lm_head.weight written: {'lm_head.weight' in names})")
        want_dtype = "torch.bfloat16" if name == "llama_bf16" else "torch.float32"
        if dtypes != {want_dtype} or cfg.get("dtype") != want_dtype[6:]:
            bad.append(f"{name}: export dtypes {sorted(dtypes)}, config dtype {cfg.get('dtype')}; want {want_dtype}")
        if name == "llama_bf16":
            src_size = sum(os.path.getsize(f"{root}/{name}/{f}") for f in r["files"])
            exp_size = sum(os.path.getsize(f"{exp}/{f}") for f in os.listdir(exp) if f.endswith(".safetensors"))
            print(f"{name}: bf16 source {src_size} bytes, export {exp_size} bytes ({data} of tensor data)")
            if abs(exp_size - src_size) > 4096:
                bad.append(f"{name}: the bf16 export is {exp_size} bytes, the source {src_size}")
        if name == "llama_sharded":
            n = len([f for f in os.listdir(exp) if f.endswith(".safetensors")])
            if n < 3 or not os.path.exists(f"{exp}/model.safetensors.index.json"):
                bad.append(f"{name}: the export has {n} weights files (--max-shard-size 12KB: at least 3 and an index)")
    for b in bad:
        print("FAIL:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    {"build": build, "verify": verify}[sys.argv[1]](sys.argv[2])
