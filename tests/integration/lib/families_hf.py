# The transformers side of families_hf.sh (scripts/test-env.sh's python: torch, transformers 5).
#   families_hf.py build DIR   the token file; tiny folders saved by save_pretrained (fp32):
#       pad_untied, pad_tied   Llama with pad_token_id = PAD (untied, tied), and the reference: every
#                              parameter after STEPS steps of torch AdamW on the job's rows (fsdpd's
#                              optimizer: decay on 2-D tensors only, clip_grad_norm_, constant lr), with
#                              nn.Embedding's padding_idx as transformers builds it, and the same steps
#                              with pad_token_id = None (the control: the row trained as any other)
#       head_differs           a tied config whose weights also hold an lm_head.weight that differs from
#                              embed_tokens (transformers 5 loads both, untied) and its step-1 loss; the
#                              control: the same folder loaded tied (lm_head dropped)
#       tied_llama, tied_qwen2, tied_gpt2   tied models saved by save_pretrained with lm_head.weight
#                              also written, equal to the embedding (as many published tied checkpoints
#                              hold it; transformers ties them): step-1 loss, the logits of PROMPT and
#                              whether transformers tied them
#       ulp_llama, ulp_qwen2, ulp_gpt2      the same with one element of lm_head.weight one float step
#                              up (transformers 5 loads both, untied) and its step-1 loss
#       gpt2_drop, llama_drop  GPT2Config() with its default dropout 0.1 (the keys left out); Llama with
#                              attention_dropout 0.1
#       qwen2, qwen3, mistral, phi3, llama   one tiny folder each, for init = FILE under another arch
#   families_hf.py head EXPORT TIED   an export as transformers loads it: tied (TIED 1: one tensor, and
#                              no lm_head.weight in its weights, as save_pretrained writes a tied model)
#                              or untied (TIED 0: lm_head.weight its own tensor)
#   families_hf.py logits DIR NAME FILE   fsdpctl sample --logits (FILE) against transformers' on PROMPT,
#                              to 1e-5 of the largest
#   families_hf.py rows DIR NAME EXPORT   fsdpd's export after STEPS steps against the reference: the pad
#                              row to 1e-6 (untied: decay alone moves it, so both compute (1 - lr·wd)^3·w
#                              in fp32), the whole embedding to 1e-5 of its largest (fp32 AdamW over
#                              3 steps), and the control's pad row far from fsdpd's
import json, math, struct, sys

import torch
from safetensors.torch import load_file, save_file
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen2Config, Qwen2ForCausalLM,
                          Qwen3Config, Qwen3ForCausalLM)

V, T, ROWS, STEPS, PAD, PROMPT = 256, 32, 4, 3, 5, "tied heads"   # vocabulary, seq_len, rows per step (2 ranks x batch 2)
LR, WD, B1, B2, EPS, CLIP = 1e-3, 0.1, 0.9, 0.95, 1e-8, 1.0
torch.set_num_threads(1)
SHAPE = dict(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, intermediate_size=64,
             vocab_size=V, max_position_embeddings=64)


def tokens():
    g = torch.Generator().manual_seed(3)
    t = torch.randint(0, V, (STEPS * ROWS * T + 1,), generator=g)
    t[torch.rand(t.shape, generator=g) < 0.2] = PAD   # a fifth of the tokens are the pad token
    return t


def write_tokens(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks.tolist()))


def batch(toks, step):
    first = (step - 1) * ROWS * T
    x = torch.stack([toks[first + r * T:first + r * T + T] for r in range(ROWS)])
    y = torch.stack([toks[first + r * T + 1:first + r * T + T + 1] for r in range(ROWS)])
    return x, y


def loss_of(model, x, y):
    lg = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))


def train(model, toks):
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() == 2], "weight_decay": WD},
              {"params": [p for p in params if p.dim() != 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(B1, B2), eps=EPS)
    for s in range(1, STEPS + 1):
        x, y = batch(toks, s)
        opt.zero_grad()
        loss_of(model, x, y).backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
    return model.model.embed_tokens.weight.detach().clone()


def save_weights(d, model, extra=None):
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    if extra: sd.update(extra)
    save_file(sd, f"{d}/model.safetensors", metadata={"format": "pt"})


def is_tied(model):
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def prompt_ids():
    return torch.tensor([list(PROMPT.encode())])


# Tied models, sensitive to the head: a random embedding (transformers' init would do) and, for Qwen2,
# random q/k/v biases (its init zeroes them).
TIED = (("llama", LlamaForCausalLM, lambda: LlamaConfig(**SHAPE, tie_word_embeddings=True)),
        ("qwen2", Qwen2ForCausalLM, lambda: Qwen2Config(**SHAPE, tie_word_embeddings=True)),
        ("gpt2", GPT2LMHeadModel, lambda: GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                                     embd_pdrop=0.0, attn_pdrop=0.0, resid_pdrop=0.0,
                                                     tie_word_embeddings=True)))


def build_tied_heads(d, x, y, refs):
    for i, (fam, cls, cfg) in enumerate(TIED):
        torch.manual_seed(20 + i)
        model = cls(cfg()).float()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "bias" in n and "self_attn" in n: p.normal_(0, 0.2)
        for kind in ("tied", "ulp"):
            name = f"{kind}_{fam}"
            model.save_pretrained(f"{d}/{name}")   # a tied model: no lm_head.weight written
            sd = load_file(f"{d}/{name}/model.safetensors")
            assert "lm_head.weight" not in sd, sorted(sd)
            head = model.get_input_embeddings().weight.detach().clone()
            if kind == "ulp":
                head[3, 7] = torch.nextafter(head[3, 7], torch.tensor(math.inf))
            sd["lm_head.weight"] = head
            save_file(sd, f"{d}/{name}/model.safetensors", metadata={"format": "pt"})
            loaded = cls.from_pretrained(f"{d}/{name}").float().eval()
            with torch.no_grad():
                refs[name] = {"tied": is_tied(loaded), "loss": loss_of(loaded, x, y).item(),
                              "logits": loaded(input_ids=prompt_ids()).logits[0].tolist()}
            print(f"{name}: transformers ties them: {refs[name]['tied']}, step-1 loss {refs[name]['loss']:.6f}")


def head(export, want_tied):
    names = load_file(f"{export}/model.safetensors").keys()
    model = AutoModelForCausalLM.from_pretrained(export).float()
    tied, written = is_tied(model), "lm_head.weight" in names
    print(f"{export}: transformers loads it {'tied' if tied else 'untied'} ({type(model).__name__}); "
          f"lm_head.weight {'written' if written else 'not written'}")
    sys.exit(0 if tied == want_tied and written == (not want_tied) else 1)


def logits(d, name, path):
    want = torch.tensor(json.load(open(f"{d}/refs.json"))[name]["logits"])
    got = torch.tensor(json.load(open(path)))
    diff = (got - want).abs().max().item() if got.shape == want.shape else math.inf
    print(f"{name}: fsdpctl sample --logits vs transformers: max |diff| {diff:.2e} (largest {want.abs().max():.3f})")
    sys.exit(0 if diff <= 1e-5 * want.abs().max().item() else 1)


def build(d):
    toks = tokens()
    write_tokens(f"{d}/train.bin", toks)
    refs = {}
    for name, tie in (("pad_untied", False), ("pad_tied", True)):
        torch.manual_seed(11)
        model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=tie, pad_token_id=PAD)).float()
        with torch.no_grad():   # the init zeroes the pad row: give it values, so that the decay moves it
            model.model.embed_tokens.weight[PAD].normal_(0, 0.5)
        model.save_pretrained(f"{d}/{name}")
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        ref = train(model, toks)
        model.config.pad_token_id = None
        ctl = LlamaForCausalLM(model.config).float()   # padding_idx None: the lookup trains the row
        ctl.load_state_dict(start)
        refs[name] = {"embed": ref[PAD].tolist(), "embed_all_max": ref.abs().max().item(),
                      "control": train(ctl, toks)[PAD].tolist()}
        torch.save(ref, f"{d}/{name}.ref.pt")

    x, y = batch(toks, 1)
    torch.manual_seed(12)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=False)).float()
    with torch.no_grad():
        model.lm_head.weight.copy_(torch.randn(V, 32) * 0.5)
    model.save_pretrained(f"{d}/head_differs")
    c = json.load(open(f"{d}/head_differs/config.json"))
    c["tie_word_embeddings"] = True
    json.dump(c, open(f"{d}/head_differs/config.json", "w"), indent=2)
    loaded = LlamaForCausalLM.from_pretrained(f"{d}/head_differs").float().eval()
    tied_model = LlamaForCausalLM(LlamaConfig(**SHAPE, tie_word_embeddings=True)).float().eval()
    tied_model.load_state_dict({k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}, strict=False)
    tied_model.tie_weights()
    with torch.no_grad():
        refs["head_differs"] = {"tied": is_tied(loaded), "loss": loss_of(loaded, x, y).item(),
                                "control": loss_of(tied_model, x, y).item()}
    print(f"head_differs: transformers ties them: {refs['head_differs']['tied']}")
    build_tied_heads(d, x, y, refs)

    torch.manual_seed(13)
    GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4)).save_pretrained(
        f"{d}/gpt2_drop")
    c = json.load(open(f"{d}/gpt2_drop/config.json"))
    for k in ("embd_pdrop", "attn_pdrop", "resid_pdrop"):   # GPT2Config's defaults (0.1) where absent
        c.pop(k, None)
    json.dump(c, open(f"{d}/gpt2_drop/config.json", "w"), indent=2)
    LlamaForCausalLM(LlamaConfig(**SHAPE, attention_dropout=0.1)).save_pretrained(f"{d}/llama_drop")

    for name, cls, cfg in (("qwen2", Qwen2ForCausalLM, Qwen2Config), ("qwen3", Qwen3ForCausalLM, Qwen3Config),
                           ("mistral", MistralForCausalLM, MistralConfig), ("phi3", Phi3ForCausalLM, Phi3Config),
                           ("llama", LlamaForCausalLM, LlamaConfig)):
        extra = {"head_dim": 8} if name == "qwen3" else {}
        extra.update({"pad_token_id": None} if name == "phi3" else {})
        cls(cfg(**SHAPE, **extra)).save_pretrained(f"{d}/{name}")
    json.dump(refs, open(f"{d}/refs.json", "w"))


def rows(d, name, export):
    ref = json.load(open(f"{d}/refs.json"))[name]
    got = load_file(f"{export}/model.safetensors")["model.embed_tokens.weight"]
    full = torch.load(f"{d}/{name}.ref.pt")
    want, ctl = torch.tensor(ref["embed"]), torch.tensor(ref["control"])
    d_pad = (got[PAD] - want).abs().max().item()
    d_all = (got - full).abs().max().item()
    d_ctl = (got[PAD] - ctl).abs().max().item()
    print(f"{name}: pad row vs transformers {d_pad:.2e}, embedding vs transformers {d_all:.2e} "
          f"(largest {ref['embed_all_max']:.3f}), pad row vs the control (padding_idx None) {d_ctl:.2e}")
    tol_pad = 1e-6 if name == "pad_untied" else 1e-5 * ref["embed_all_max"]
    ok = d_pad <= tol_pad and d_all <= 1e-5 * ref["embed_all_max"] and d_ctl > 1e-4
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    elif sys.argv[1] == "head":
        head(sys.argv[2], sys.argv[3] == "1")
    elif sys.argv[1] == "logits":
        logits(sys.argv[2], sys.argv[3], sys.argv[4])
    else:
        rows(sys.argv[2], sys.argv[3], sys.argv[4])
