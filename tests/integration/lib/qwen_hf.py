# The transformers side of qwen_hf.sh (run with scripts/test-env.sh's python: torch, transformers 5).
#   qwen_hf.py build DIR   tiny Qwen2 (tied, untied), Qwen2.5-style, Qwen3 (head_dim != hidden / heads;
#                          with attention_bias) and Llama (attention_bias, mlp_bias, head_dim) folders saved
#                          by save_pretrained, sensitive to every feature: biases drawn non-zero, norm
#                          weights (q_norm and k_norm included) away from 1, peaked attention and a strong
#                          head (hf_finetune.py's sharpen); the token file; DIR/refs.json: each model's
#                          step-1 loss on the job's first rows, and the same loss with each feature removed
#                          on the transformers side (the controls); DIR/nobias_<name>: the folder with
#                          every bias zeroed, for the control run on fsdpd's side
#   qwen_hf.py verify DIR  every export loads with from_pretrained as the source's class; its logits equal
#                          fsdpd's (DIR/logits-*.json, fsdpctl sample --logits) to 1e-5; tied stays tied
import copy, json, os, sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_finetune as hf   # noqa: E402  (the shared tokenizer, token stream, rows, loss and comparison)

V, ROWS, T = hf.V, hf.ROWS, 32
BASE = dict(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2)

# name: (class, config), each with the features its controls remove
KINDS = {
    "qwen2_tied": (Qwen2ForCausalLM, lambda: Qwen2Config(**BASE, tie_word_embeddings=True,
                                                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "qwen2_untied": (Qwen2ForCausalLM, lambda: Qwen2Config(**BASE, tie_word_embeddings=False,
                                                           rope_parameters={"rope_type": "default",
                                                                            "rope_theta": 10000.0})),
    # Qwen2.5's published form: theta 1e6, a sliding_window that is not used (use_sliding_window false,
    # max_window_layers), tied as Qwen2.5-0.5B
    "qwen25": (Qwen2ForCausalLM, lambda: Qwen2Config(**{**BASE, "num_attention_heads": 8, "num_key_value_heads": 2},
                                                     tie_word_embeddings=True, use_sliding_window=False,
                                                     sliding_window=32768, max_window_layers=21,
                                                     rope_parameters={"rope_type": "default",
                                                                      "rope_theta": 1000000.0})),
    # head_dim 16 over hidden 32 with 4 heads (8 each): q_proj [64, 32], o_proj [32, 64]
    "qwen3": (Qwen3ForCausalLM, lambda: Qwen3Config(**BASE, head_dim=16, tie_word_embeddings=False,
                                                    attention_bias=False,
                                                    rope_parameters={"rope_type": "default",
                                                                     "rope_theta": 1000000.0})),
    "qwen3_bias": (Qwen3ForCausalLM, lambda: Qwen3Config(**BASE, head_dim=12, tie_word_embeddings=True,
                                                         attention_bias=True,
                                                         rope_parameters={"rope_type": "default",
                                                                          "rope_theta": 10000.0})),
    "llama_bias": (LlamaForCausalLM, lambda: LlamaConfig(**BASE, head_dim=12, attention_bias=True, mlp_bias=True,
                                                         pad_token_id=None,
                                                         rope_parameters={"rope_type": "default",
                                                                          "rope_theta": 500000.0})),
}


def draw(model, one=1.0):
    """Biases N(0, 0.3) (transformers initializes them to 0) and norm weights ONE + N(0, 0.3) (their
    init; Gemma 3's 1 + w norms start at w = 0), so that both enter every product."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith(".bias"):
                w.copy_(0.3 * torch.randn(w.shape, generator=g))
            elif name.endswith("norm.weight"):
                w.copy_(one + 0.3 * torch.randn(w.shape, generator=g))
    return model


def sensitize(model):
    """draw's biases and norms, q_norm and k_norm's scaled by 4 (peaked attention where scaling q_proj
    would be normalized away), then hf_finetune's sharpen: every feature moves the loss."""
    draw(model)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                w.mul_(4.0)
    return hf.sharpen(model)


def controls(name, d, x, y):
    """transformers' loss with each feature fsdpd must honour removed: each must differ from the real one."""
    out = {}
    m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    if any(n.endswith(".bias") for n, _ in m.named_parameters()):
        with torch.no_grad():
            for n, w in m.named_parameters():
                if n.endswith(".bias"):
                    w.zero_()
        out["no biases"] = hf.loss_of(m, x, y)
    if name == "qwen3":   # (qwen3_bias's tied head and biases dominate its loss: its q/k norms are checked here)
        m = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        for layer in m.model.layers:
            layer.self_attn.q_norm = torch.nn.Identity()
            layer.self_attn.k_norm = torch.nn.Identity()
        out["no q/k norm"] = hf.loss_of(m, x, y)
    return out


def zero_biases(src, dst):
    """DST: SRC's folder with every bias zeroed (the control that removes the biases on fsdpd's side)."""
    os.makedirs(dst, exist_ok=True)
    for f in os.listdir(src):
        if f == "model.safetensors":
            t = load_file(f"{src}/{f}")
            save_file({k: (torch.zeros_like(v) if k.endswith(".bias") else v) for k, v in t.items()}, f"{dst}/{f}",
                      metadata={"format": "pt"})
        else:
            with open(f"{src}/{f}", "rb") as a, open(f"{dst}/{f}", "wb") as b:
                b.write(a.read())


def build(root):
    torch.manual_seed(0)
    toks = hf.stream(256, 7)
    raw = toks.tolist()
    import struct
    with open(f"{root}/train.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(raw), *[0] * 253) + struct.pack(f"<{len(raw)}H", *raw))
    refs = {}
    x, y = hf.rows(toks, T, ROWS)
    px, _ = hf.rows(toks, T, 1, 5)
    for name, (cls, mk) in KINDS.items():
        torch.manual_seed(1)
        d = f"{root}/{name}"
        sensitize(cls(mk())).save_pretrained(d)
        hf.save_tokenizer(d)
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
        assert type(ref) is cls, (name, type(ref))
        refs[name] = {"T": T, "loss": hf.loss_of(ref, x, y), "controls": controls(name, d, x, y),
                      "class": cls.__name__, "prompt": bytes(px[0].tolist()).decode("ascii")}
        if name == "qwen2_untied":
            zero_biases(d, f"{root}/nobias_{name}")
    json.dump(refs, open(f"{root}/refs.json", "w"), indent=1)


def verify(root):
    refs, bad = json.load(open(f"{root}/refs.json")), []
    for name, r in refs.items():
        exp = f"{root}/exp_{name}"
        if not os.path.isdir(exp):
            bad.append(f"{name}: no export")
            continue
        model = AutoModelForCausalLM.from_pretrained(exp, dtype=torch.float32)
        if type(model).__name__ != r["class"]:
            bad.append(f"{name}: the export loads as {type(model).__name__}, the source as {r['class']}")
        ids = list(r["prompt"].encode())
        with torch.no_grad():
            lg = model(input_ids=torch.tensor([ids])).logits[0].tolist()
        for src in ("ckpt", "export"):
            f = f"{root}/logits-{name}-{src}.json"
            if not os.path.exists(f):
                bad.append(f"{name}: no logits from fsdpctl sample ({src})")
                continue
            ok, diff = hf.close(json.load(open(f)), lg)
            print(f"{name}: logits of fsdpd ({src}) vs transformers on the export: max |diff| {diff:.2e}")
            if not ok:
                bad.append(f"{name}: fsdpd's logits ({src}) differ from transformers' by {diff:.3g}")
        cfg, src_cfg = json.load(open(f"{exp}/config.json")), json.load(open(f"{root}/{name}/config.json"))
        for k in ("architectures", "model_type", "head_dim", "attention_bias", "mlp_bias", "tie_word_embeddings",
                  "use_sliding_window", "sliding_window", "rope_parameters"):
            if src_cfg.get(k) != cfg.get(k):
                bad.append(f"{name}: config.json {k} = {cfg.get(k)!r}, the source's {src_cfg.get(k)!r}")
        if cfg.get("tie_word_embeddings") and model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr():
            bad.append(f"{name}: the export is not tied")
    for b in bad:
        print("FAIL:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    {"build": build, "verify": verify}[sys.argv[1]](sys.argv[2])
