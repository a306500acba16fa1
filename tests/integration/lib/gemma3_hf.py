# The transformers side of gemma3_hf.sh (scripts/test-env.sh's python: torch, transformers 5).
#   gemma3_hf.py build DIR    a tiny Gemma3ForCausalLM folder saved by save_pretrained: 4 layers with
#                             sliding_window_pattern 2 (layers 1 and 3 global), a window of 8 below T = 32,
#                             query_pre_attn_scalar 24 (head_dim 16), linear rope scaling 4 on the global
#                             layers (base 1e5; the sliding ones 1e4), nonzero norm weights, sharpened as
#                             hf_finetune.py's models; the copy-task token file; DIR/refs.json: the step-1
#                             loss on the job's first rows and the loss of each control (transformers
#                             computing something else: w instead of 1 + w in the norms, unscaled
#                             embeddings, one rope base for all layers, full attention instead of the
#                             window, head_dim's scale instead of query_pre_attn_scalar)
#   gemma3_hf.py verify DIR   the export loads as Gemma3ForCausalLM with the source's settings; its logits
#                             equal fsdpd's (DIR/logits-*.json, 1e-5 of the largest)
import copy, json, os, struct, sys

import torch
from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig
from transformers.models.gemma3 import modeling_gemma3

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_finetune import ROWS, RTOL, V, close, loss_of, rows, save_tokenizer, sharpen, stream  # noqa: E402

T, WINDOW = 32, 8
SETTINGS = ("architectures", "model_type", "sliding_window", "layer_types", "rope_parameters", "head_dim",
            "query_pre_attn_scalar", "tie_word_embeddings")


def config():
    return Gemma3TextConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                            num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=128,
                            rms_norm_eps=1e-6, query_pre_attn_scalar=24, sliding_window=WINDOW,
                            layer_types=["sliding_attention", "full_attention"] * 2, bos_token_id=None,
                            eos_token_id=None, pad_token_id=None,
                            rope_parameters={"full_attention": {"rope_type": "linear", "factor": 4.0,
                                                                "rope_theta": 100000.0},
                                             "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}})


def control_losses(d, x, y):
    out = {}

    def variant(cfg=None, edit=None):
        m = Gemma3ForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32).eval()
        if edit:
            edit(m)
        return loss_of(m, x, y)

    base = AutoModelForCausalLM.from_pretrained(d).config
    one = copy.deepcopy(base)
    one.rope_parameters["sliding_attention"] = dict(one.rope_parameters["full_attention"])
    out["one_rope_base"] = variant(one)
    full = copy.deepcopy(base)
    full.sliding_window = 4096
    out["full_attention"] = variant(full)
    hd = copy.deepcopy(base)
    hd.query_pre_attn_scalar = hd.head_dim
    out["head_dim_scale"] = variant(hd)
    out["unscaled_embeddings"] = variant(edit=lambda m: m.model.embed_tokens.embed_scale.fill_(1.0))
    plain = modeling_gemma3.Gemma3RMSNorm.forward
    modeling_gemma3.Gemma3RMSNorm.forward = lambda self, x: (self._norm(x.float()) * self.weight.float()).type_as(x)
    try:
        out["w_not_1_plus_w"] = variant()
    finally:
        modeling_gemma3.Gemma3RMSNorm.forward = plain
    return out


def build(root):
    torch.manual_seed(0)
    toks = stream(256, 7)
    raw = toks.tolist()
    with open(f"{root}/train.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(raw), *[0] * 253) + struct.pack(f"<{len(raw)}H", *raw))
    torch.manual_seed(1)
    model = sharpen(Gemma3ForCausalLM(config()))
    with torch.no_grad():   # norms away from their init (0), so that 1 + w and w differ everywhere
        for name, w in model.named_parameters():
            if name.endswith("norm.weight"):
                w.normal_(0.0, 0.5)
    d = f"{root}/gemma3"
    model.save_pretrained(d)
    save_tokenizer(d)
    ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
    assert type(ref).__name__ == "Gemma3ForCausalLM"
    x, y = rows(toks, T, ROWS)
    px, _ = rows(toks, T, 1, 5)
    refs = {"T": T, "loss": loss_of(ref, x, y), "controls": control_losses(d, x, y),
            "prompt": bytes(px[0].tolist()).decode("ascii")}
    json.dump(refs, open(f"{root}/refs.json", "w"), indent=1)


def verify(root):
    refs, bad = json.load(open(f"{root}/refs.json")), []
    exp = f"{root}/exp"
    model = AutoModelForCausalLM.from_pretrained(exp, dtype=torch.float32).eval()
    if type(model).__name__ != "Gemma3ForCausalLM":
        bad.append(f"the export loads as {type(model).__name__}")
    ids = list(refs["prompt"].encode())
    with torch.no_grad():
        hf = model(input_ids=torch.tensor([ids])).logits[0].tolist()
    for src in ("ckpt", "export"):
        ok, diff = close(json.load(open(f"{root}/logits-{src}.json")), hf)
        print(f"gemma3: logits of fsdpd ({src}) vs transformers on the export: max |diff| {diff:.2e} "
              f"(tolerance {RTOL:g} of the largest)")
        if not ok:
            bad.append(f"fsdpd's logits ({src}) differ from transformers' by {diff:.3g}")
    src_cfg, cfg = json.load(open(f"{root}/gemma3/config.json")), json.load(open(f"{exp}/config.json"))
    for k in SETTINGS:
        if src_cfg.get(k) != cfg.get(k):
            bad.append(f"config.json {k} = {cfg.get(k)!r}, the source's {src_cfg.get(k)!r}")
    for b in bad:
        print("FAIL:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    {"build": build, "verify": verify}[sys.argv[1]](sys.argv[2])
