# The transformers side of phi3_hf.sh (scripts/test-env.sh's python: torch, transformers 5).
#   phi3_hf.py build DIR   two tiny Phi3ForCausalLM folders saved by save_pretrained (rope none; longrope
#                          with seq_len within original_max_position_embeddings), sharpened as
#                          hf_finetune.py's (the loss follows positions and the head), the token file,
#                          and DIR/refs.json: each one's step-1 loss on the job's first rows and its
#                          controls: the loss with the fused halves swapped (gate | up, k | v), and for
#                          longrope with the default rope and with attention_factor 1
#   phi3_hf.py verify DIR  every export loads as Phi3ForCausalLM with fused qkv_proj and gate_up_proj, its
#                          config's rope as the source's, and its logits equal fsdpd's (DIR/logits-*.json)
import copy, json, os, struct, sys

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, Phi3Config, Phi3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_finetune import ROWS, V, close, loss_of, rows, save_tokenizer, sharpen, stream  # noqa: E402

L, C, H, KV, F, T = 2, 64, 4, 2, 96, 32
HS = C // H                        # 16: 8 rotary frequencies
SHORT = [1.0, 1.25, 1.6, 2.1, 2.9, 4.0, 5.5, 7.5]
LONG = [f * 3 for f in SHORT]      # read only beyond original_max_position_embeddings (refused by fsdpd)


def config(rope):
    # max 4096 over original 64: factor 64, so transformers' attention factor is sqrt(1 + ln 64 / ln 64) = sqrt 2
    return Phi3Config(vocab_size=V, hidden_size=C, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                      num_key_value_heads=KV, max_position_embeddings=4096, original_max_position_embeddings=64,
                      rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None, rope_parameters=rope)


KINDS = {
    "phi3_plain": {"rope_type": "default", "rope_theta": 10000.0},
    "phi3_long": {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": SHORT, "long_factor": LONG},
}


def sharpen_fused(model):
    """hf_finetune.py's sharpen for the fused names: q and k (the first (H + KV)·HS rows of qkv_proj)
    scaled up, and the head; the MLP strengthened too, so that its halves' order shows in the loss."""
    sharpen(model)
    with torch.no_grad():
        for name, w in model.named_parameters():
            if name.endswith("qkv_proj.weight"):
                w[:(H + KV) * HS].mul_(16.0)
            elif name.endswith(("gate_up_proj.weight", "down_proj.weight")):
                w.mul_(4.0)
    return model


def swapped(d, what):
    """The folder's model with the halves of a fused tensor swapped: fsdpd reading them in the wrong
    order would compute this one."""
    m = Phi3ForCausalLM.from_pretrained(d, dtype=torch.float32)
    with torch.no_grad():
        for layer in m.model.layers:
            if what == "gate_up":
                w = layer.mlp.gate_up_proj.weight
                w.copy_(torch.cat([w[F:], w[:F]]))
            else:   # k | v
                w = layer.self_attn.qkv_proj.weight
                q, k, v = w[:C], w[C:C + KV * HS], w[C + KV * HS:]
                w.copy_(torch.cat([q, v, k]))
    return m.eval()


def controls(name, model, d, x, y):
    out = {"gate and up swapped": loss_of(swapped(d, "gate_up"), x, y),
           "k and v swapped": loss_of(swapped(d, "kv"), x, y)}
    if name == "phi3_long":
        for what, rope in (("default rope", {"rope_type": "default", "rope_theta": 10000.0}),
                           ("attention factor 1", dict(KINDS[name], attention_factor=1.0))):
            cfg = copy.deepcopy(model.config)
            cfg.rope_parameters = rope
            out[what] = loss_of(Phi3ForCausalLM.from_pretrained(d, config=cfg, dtype=torch.float32).eval(), x, y)
    return out


def build(root):
    toks = stream(256, 7)
    raw = toks.tolist()
    with open(f"{root}/train.bin", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(raw), *[0] * 253) + struct.pack(f"<{len(raw)}H", *raw))
    refs = {}
    for name, rope in KINDS.items():
        torch.manual_seed(1)
        model = sharpen_fused(Phi3ForCausalLM(config(rope)))
        d = f"{root}/{name}"
        model.save_pretrained(d)
        save_tokenizer(d)
        ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        assert type(ref).__name__ == "Phi3ForCausalLM", type(ref)
        if name == "phi3_long":
            emb = ref.model.rotary_emb
            assert abs(emb.attention_scaling - 2 ** 0.5) < 1e-12, emb.attention_scaling
        x, y = rows(toks, T, ROWS)
        px, _ = rows(toks, T, 1, 5)
        refs[name] = {"T": T, "loss": loss_of(ref, x, y), "controls": controls(name, ref, d, x, y),
                      "prompt": bytes(px[0].tolist()).decode("ascii")}
    json.dump(refs, open(f"{root}/refs.json", "w"), indent=1)


def verify(root):
    refs, bad = json.load(open(f"{root}/refs.json")), []
    for name, r in refs.items():
        exp = f"{root}/exp_{name}"
        model = AutoModelForCausalLM.from_pretrained(exp, dtype=torch.float32).eval()
        if type(model).__name__ != "Phi3ForCausalLM":
            bad.append(f"{name}: the export loads as {type(model).__name__}")
        with safe_open(f"{exp}/model.safetensors", "pt") as sf:
            names = set(sf.keys())
        src = set(safe_open(f"{root}/{name}/model.safetensors", "pt").keys())
        if names != src or not any(k.endswith("qkv_proj.weight") for k in names):
            bad.append(f"{name}: the export's tensors {sorted(names ^ src)} differ from the source's")
        cfg, src_cfg = json.load(open(f"{exp}/config.json")), json.load(open(f"{root}/{name}/config.json"))
        for k in ("architectures", "model_type", "rope_parameters", "original_max_position_embeddings"):
            if cfg.get(k) != src_cfg.get(k):
                bad.append(f"{name}: config.json {k} = {cfg.get(k)!r}, the source's {src_cfg.get(k)!r}")
        ids = list(r["prompt"].encode())
        with torch.no_grad():
            hf = model(input_ids=torch.tensor([ids])).logits[0].tolist()
        for src_kind in ("ckpt", "export"):
            ok, diff = close(json.load(open(f"{root}/logits-{name}-{src_kind}.json")), hf)
            print(f"{name}: logits of fsdpd ({src_kind}) vs transformers on the export: max |diff| {diff:.2e}")
            if not ok:
                bad.append(f"{name}: fsdpd's logits ({src_kind}) differ from transformers' by {diff:.3g}")
    for b in bad:
        print("FAIL:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    {"build": build, "verify": verify}[sys.argv[1]](sys.argv[2])
