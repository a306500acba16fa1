# The transformers side of mistral_hf.sh (run with scripts/test-env.sh's python: torch, transformers 5).
#   mistral_hf.py build DIR    a tiny MistralForCausalLM folder saved by save_pretrained (sliding_window
#                              16 below T = 64, sharpened as hf_finetune.py's models, on a copy task whose
#                              source lies exactly 16 tokens back: just outside the window), the token
#                              file, and DIR/refs.json: the step-1 loss on the job's first rows, and the
#                              same loss with full attention instead of the window (the control)
#   mistral_hf.py verify DIR   the export loads as MistralForCausalLM with the source's sliding_window;
#                              its logits equal fsdpd's (DIR/logits-*.json, 1e-5 of the largest)
import copy, json, os, sys

import torch
from transformers import AutoModelForCausalLM, MistralConfig, MistralForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_finetune import ROWS, RTOL, V, close, loss_of, rows, save_tokenizer, sharpen, stream  # noqa: E402

T, WINDOW = 64, 16


def build(root):
    torch.manual_seed(0)
    toks = stream(256, 7)   # blocks of 32: a random half, then the same half 16 tokens later
    raw = toks.tolist()
    import struct
    with open(f"{root}/train.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(raw), *[0] * 253) + struct.pack(f"<{len(raw)}H", *raw))
    torch.manual_seed(1)
    cfg = MistralConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=1,
                        eos_token_id=2, pad_token_id=None, sliding_window=WINDOW,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    model = sharpen(MistralForCausalLM(cfg))
    d = f"{root}/mistral"
    model.save_pretrained(d)
    save_tokenizer(d)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
    assert type(ref).__name__ == "MistralForCausalLM" and ref.config.sliding_window == WINDOW
    x, y = rows(toks, T, ROWS)
    full = copy.deepcopy(ref.config)
    full.sliding_window = None
    off = loss_of(MistralForCausalLM.from_pretrained(d, config=full, dtype=torch.float32), x, y)
    px, _ = rows(toks, T, 1, 5)
    refs = {"T": T, "loss": loss_of(ref, x, y), "full_attention": off,
            "prompt": bytes(px[0].tolist()).decode("ascii")}
    json.dump(refs, open(f"{root}/refs.json", "w"), indent=1)


def verify(root):
    refs, bad = json.load(open(f"{root}/refs.json")), []
    exp = f"{root}/exp"
    model = AutoModelForCausalLM.from_pretrained(exp, dtype=torch.float32)
    if type(model).__name__ != "MistralForCausalLM" or model.config.sliding_window != WINDOW:
        bad.append(f"the export loads as {type(model).__name__} with sliding_window {model.config.sliding_window}")
    ids = list(refs["prompt"].encode())
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([ids])).logits[0].tolist()
    for src in ("ckpt", "export"):
        ok, diff = close(json.load(open(f"{root}/logits-{src}.json")), hf)
        print(f"mistral: logits of fsdpd ({src}) vs transformers on the export: max |diff| {diff:.2e} "
              f"(tolerance {RTOL:g} of the largest)")
        if not ok:
            bad.append(f"fsdpd's logits ({src}) differ from transformers' by {diff:.3g}")
    src_cfg, cfg = json.load(open(f"{root}/mistral/config.json")), json.load(open(f"{exp}/config.json"))
    for k in ("architectures", "model_type", "sliding_window", "rope_parameters", "head_dim"):
        if src_cfg.get(k) != cfg.get(k):
            bad.append(f"config.json {k} = {cfg.get(k)!r}, the source's {src_cfg.get(k)!r}")
    for b in bad:
        print("FAIL:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    {"build": build, "verify": verify}[sys.argv[1]](sys.argv[2])
