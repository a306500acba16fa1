# The peft side of lora_peft.sh (scripts/test-env.sh's python: torch, transformers 5, peft).
#   lora_peft.py build DIR SET   the models of SET (base: tiny GPT-2 and Llama; families: Qwen2, Qwen3,
#                             Mistral, Gemma 3 and Phi-3 as their own tests build them, FAMILY_OF) as folders
#                             (save_pretrained, fp32), the token file, and for each an adapter folder to start
#                             from (peft's LoRA on every attention and MLP projection, B made non-zero so that
#                             the adapters change the loss from step 1); then peft's reference: the step-1
#                             loss, 10 steps of torch AdamW on the adapters (the job's rows and
#                             hyperparameters; in fp64, and in fp32 to show its own rounding), and the
#                             controls: the step-1 loss without the alpha/r scale, and 10 steps that also
#                             train the base
#   lora_peft.py build DIR base NF4_TOOL   the same for QLoRA ([lora] base_dtype = nf4): the models at widths of
#                             64 (NF4's block), and peft's reference over the base as fsdpd holds it: each
#                             block's 2-D tensors quantized by fsdpd's NF4 (NF4_TOOL; its codes checked equal to
#                             bitsandbytes' quantize_4bit) and dequantized by bitsandbytes to bf16, every other
#                             tensor rounded to bf16 (deq_M.safetensors); the control trains over the base
#                             un-quantized instead of the base
#   lora_peft.py verify DIR M OUT   fsdpd's run OUT of model M against the reference: step-1 loss (1e-5
#                             relative), every adapter weight after 10 steps (1e-5 of the tensor's largest),
#                             every base tensor bit-identical to the loaded one (QLoRA: to deq_M, the codes
#                             and scales unchanged), the controls far; the saved adapter folder loads with
#                             PeftModel.from_pretrained and gives fsdpd's weights
#   lora_peft.py merged DIR M OUT MERGED   fsdpctl export --merge's folder MERGED of OUT's checkpoint against
#                             peft's merge_and_unload of OUT's adapter (1e-6 of each tensor's largest): QLoRA's over
#                             deq_M, the same merge over the base un-quantized far; Phi-3's over its folder, the
#                             base alone far
import copy, json, math, os, struct, subprocess, sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, Gemma3ForCausalLM, LlamaConfig,
                          LlamaForCausalLM, MistralConfig, MistralForCausalLM, Phi3ForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gemma3_hf, mistral_hf, phi3_hf, qwen_hf   # noqa: E402  (the families' tiny models)

V, T, ROWS, STEPS = 256, 32, 4, 10      # vocabulary, seq_len, rows per step (2 ranks x batch 2), steps
R, ALPHA = 4, 8.0
# lr 1e-3: at 1e-2 AdamW's element-wise normalization makes 10 steps of this tiny problem chaotic, so
# that torch itself in fp32 ends 1e-2 (GPT-2) to 1e-1 (Llama) away from the same steps in fp64; at 1e-3
# torch fp32 is within 2e-6 (GPT-2) and 8e-6 (Llama) of fp64, and the reference is fp64
LR, WD, B1, B2, EPS, CLIP = 1e-3, 0.1, 0.9, 0.95, 1e-8, 1.0
# QLoRA's models at widths of 64 are chaotic at 1e-3 already (torch fp32 ends 3.5e-5 from fp64 on Llama);
# at 5e-4 torch fp32 is within 1.7e-6 (Llama) and 2.3e-6 (GPT-2) of fp64 (lora_peft.sh nf4's lr)
LR_WIDE = 5e-4
# The initial adapters' B: N(0, B_STD). With N(0, 1) the adapters outweigh the families' bases and their
# attention peaks: 10 steps at lr 1e-3 end with torch fp32 up to 1.6e-4 (Gemma 3) from fp64, and still
# 3.4e-5 (Phi-3) at 5e-4; with N(0, 0.1) at 5e-4 it is within 1.3e-6 on every family (lora_peft.sh
# families' lr)
B_STD = {"base": 1.0, "families": 0.1}
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# every attention and MLP projection of each: Phi-3's fused qkv_proj and gate_up_proj are one nn.Linear
# each, which peft adapts whole
TARGETS = {"gpt2": ["c_attn", "c_proj", "c_fc"], "llama": LLAMA_TARGETS, "qwen2": LLAMA_TARGETS,
           "qwen3": LLAMA_TARGETS, "mistral": LLAMA_TARGETS, "gemma3": LLAMA_TARGETS,
           "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]}
SETS = {"base": ("gpt2", "llama"), "families": ("qwen2", "qwen3", "mistral", "gemma3", "phi3")}
torch.set_num_threads(1)


def model_of(name, wide=False):
    """WIDE: every width a multiple of 64, as NF4 needs."""
    torch.manual_seed(7)
    c = 64 if wide else 32
    if name == "gpt2":
        m = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=c, vocab_size=V, n_positions=64,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    else:
        m = LlamaForCausalLM(LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         hidden_size=c, intermediate_size=2 * c, vocab_size=V,
                                         max_position_embeddings=64, tie_word_embeddings=False))
    return m.float().eval()


perturb = qwen_hf.draw   # qwen_hf's sensitize without its q/k-norm scaling and sharpening


def family_of(name):
    """The families' tiny models in their own tests' configurations, each with what it computes beyond
    Llama: Qwen2 (qwen_hf's qwen2_untied: q/k/v biases), Qwen3 (qwen_hf's qwen3: q/k norms, head_dim 16 over
    hidden 32, so q_proj is [64, 32] and o_proj [32, 64]), Mistral (mistral_hf's window of 16, below T),
    Gemma 3 (gemma3_hf's: windows of 8 on alternate layers, two rope bases, 1 + w norms,
    query_pre_attn_scalar), Phi-3 (phi3_hf's phi3_long: fused qkv_proj and gate_up_proj, longrope with its
    attention factor); biases and norms drawn (perturb), in fp32. Not sharpened as those tests sharpen them
    (peaked attention, a strong head): 10 AdamW steps of LoRA over a sharpened base are chaotic, torch in
    fp32 ending 4e-7 to 3.7e-3 of a tensor's largest from its own fp64 run (lr 5e-4, B from N(0, 0.1))."""
    torch.manual_seed(1)
    if name in ("qwen2", "qwen3"):
        cls, cfg = qwen_hf.KINDS["qwen2_untied" if name == "qwen2" else "qwen3"]
        m = perturb(cls(cfg()))
    elif name == "mistral":
        cfg = MistralConfig(**{**qwen_hf.BASE, "rms_norm_eps": 1e-5}, pad_token_id=None, sliding_window=mistral_hf.WINDOW,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
        m = perturb(MistralForCausalLM(cfg))
    elif name == "gemma3":
        m = perturb(Gemma3ForCausalLM(gemma3_hf.config()), one=0.0)
    else:
        m = perturb(Phi3ForCausalLM(phi3_hf.config(phi3_hf.KINDS["phi3_long"])))
    assert mistral_hf.WINDOW < T and gemma3_hf.WINDOW < T   # the windows cut into the job's rows
    return m.float().eval()


def in_block(n):
    return ".h." in n or "layers." in n


def nf4_base(base, tool, d):
    """BASE as fsdpd's QLoRA holds it: each block's 2-D tensors quantized by fsdpd (TOOL) and dequantized
    by bitsandbytes to bf16, every other tensor rounded to bf16; fsdpd's codes must be bitsandbytes'."""
    import numpy as np
    import bitsandbytes.functional as F
    q = copy.deepcopy(base)
    dyn, code = F.create_dynamic_map(), F.get_4bit_type("nf4", device="cpu")
    differ = []
    with torch.no_grad():
        for n, p in q.named_parameters():
            if not (in_block(n) and p.dim() == 2):
                p.copy_(p.to(torch.bfloat16).float())
                continue
            w = p.detach().contiguous().numpy()
            w.tofile(f"{d}/in.f32")
            subprocess.run([tool, f"{d}/in.f32", d], check=True)
            rd = lambda f, dt: torch.from_numpy(np.fromfile(f"{d}/{f}", dtype=dt))
            codes, aq, a2, off = rd("codes", np.uint8), rd("absmax_q", np.uint8), rd("absmax2", np.float32), rd("offset", np.float32)
            qb, _ = F.quantize_4bit(p.detach().contiguous(), blocksize=64, compress_statistics=True, quant_type="nf4")
            if not torch.equal(qb.view(-1), codes):
                differ.append(n)
            st = F.QuantState(absmax=aq, shape=p.shape, dtype=torch.bfloat16, blocksize=64, code=code, quant_type="nf4",
                              offset=off[0], state2=F.QuantState(absmax=a2, code=dyn, blocksize=256, dtype=torch.float32))
            p.copy_(F.dequantize_4bit(codes.view(-1, 1), st).float().view(p.shape))
    return q, differ


def tokens(n, seed=3):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, V, (n,), generator=g)


def write_tokens(path, toks):
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, len(toks), *([0] * 253)))
        f.write(struct.pack(f"<{len(toks)}H", *toks.tolist()))


def batch(toks, step):
    """Step STEP's rows (1-based): the ranks' rows are consecutive rows of one N·B-row batch."""
    first = (step - 1) * ROWS * T
    x = torch.stack([toks[first + r * T:first + r * T + T] for r in range(ROWS)])
    y = torch.stack([toks[first + r * T + 1:first + r * T + T + 1] for r in range(ROWS)])
    return x, y


def loss_of(model, x, y):
    lg = model(input_ids=x).logits.float()
    return torch.nn.functional.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1))


def peft_of(base, init_dir, train_base=False):
    pm = PeftModel.from_pretrained(copy.deepcopy(base), init_dir, is_trainable=True)
    for n, p in pm.named_parameters():
        p.requires_grad_(train_base or "lora_" in n)
    return pm


def train(pm, toks):
    params = [p for p in pm.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    losses = []
    for s in range(1, STEPS + 1):
        x, y = batch(toks, s)
        opt.zero_grad()
        loss = loss_of(pm, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


def adapters(pm):
    return {n.replace(".default", ""): p.detach().clone() for n, p in pm.named_parameters() if "lora_" in n}


def build(d, which, tool=None):
    from safetensors.torch import save_file
    global LR
    if tool or which == "families":
        LR = LR_WIDE
    toks = tokens(STEPS * ROWS * T + 1)
    write_tokens(f"{d}/train.bin", toks)
    refs = {}
    for name in SETS[which]:
        base = model_of(name, wide=tool is not None) if which == "base" else family_of(name)
        base.save_pretrained(f"{d}/{name}", safe_serialization=True)
        loaded = base
        if tool:   # QLoRA: the reference trains over fsdpd's NF4 base, the control over the loaded one
            base, differ = nf4_base(loaded, tool, d)
            sd = {k: v.clone().contiguous() for k, v in base.state_dict().items() if k != "lm_head.weight" or name != "gpt2"}
            save_file(sd, f"{d}/deq_{name}.safetensors")
            print(f"{name}: NF4 codes of fsdpd and bitsandbytes' quantize_4bit: "
                  f"{'bit-identical' if not differ else 'DIFFERENT in ' + ', '.join(differ)}")
            if differ:
                sys.exit(1)
        cfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS[name],
                         fan_in_fan_out=name == "gpt2", task_type="CAUSAL_LM")
        pm = get_peft_model(copy.deepcopy(base), cfg)
        torch.manual_seed(11)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, B_STD[which])   # peft starts B at zero: the adapters would not show at step 1
        pm.save_pretrained(f"{d}/init_{name}")
        x, y = batch(toks, 1)
        ref = peft_of(base, f"{d}/init_{name}")
        with torch.no_grad():
            step1 = loss_of(ref, x, y).item()
            for m in ref.modules():   # the control: the adapters without their alpha / r scale
                if hasattr(m, "scaling") and isinstance(m.scaling, dict):
                    m.scaling = {k: 1.0 for k in m.scaling}
            noscale = loss_of(ref, x, y).item()
        ref = peft_of(base, f"{d}/init_{name}")
        losses = train(ref, toks)
        torch.save(adapters(ref), f"{d}/ref10_{name}_fp32.pt")
        ref = peft_of(copy.deepcopy(base).double(), f"{d}/init_{name}").double()
        train(ref, toks)
        torch.save(adapters(ref), f"{d}/ref10_{name}.pt")
        if tool:   # the control: the same adapters trained over the base un-quantized
            ctl = peft_of(copy.deepcopy(loaded).double(), f"{d}/init_{name}").double()
        else:      # the control: the base trained too
            ctl = peft_of(copy.deepcopy(base).double(), f"{d}/init_{name}", train_base=True).double()
        train(ctl, toks)
        torch.save(adapters(ctl), f"{d}/ctl10_{name}.pt")
        refs[name] = {"step1": step1, "noscale": noscale, "losses": losses, "nf4": tool is not None}
        print(f"{name}: peft step-1 loss {step1:.7f}, without the scale {noscale:.7f}, step {STEPS} {losses[-1]:.7f}")
    json.dump(refs, open(f"{d}/refs.json", "w"), indent=1)


def close(a, b, tol=1e-5):
    return (a - b).abs().max().item() <= tol * max(b.abs().max().item(), 1e-30)


def verify(d, name, out):
    refs = json.load(open(f"{d}/refs.json"))[name]
    bad = []
    got = [json.loads(l) for l in open(f"{out}/rank-0.jsonl") if l.startswith("{")]
    l1 = got[0]["loss"]
    print(f"{name} {out}: step-1 loss fsdpd {l1:.7f}, peft {refs['step1']:.7f} ({abs(l1 / refs['step1'] - 1):.1e} "
          f"relative), without the scale {refs['noscale']:.7f} ({abs(refs['noscale'] / refs['step1'] - 1):.1e})")
    if abs(l1 - refs["step1"]) > 1e-5 * abs(refs["step1"]):
        bad.append(f"step-1 loss {l1} != peft's {refs['step1']} (1e-5 relative)")
    # the control fails the same check: an fsdpd without the scale would be told
    if abs(refs["step1"] - refs["noscale"]) <= 1e-5 * abs(refs["step1"]):
        bad.append(f"the no-scale control {refs['noscale']} passes the step-1 check against peft's {refs['step1']}")
    mine = {k: v.double() for k, v in load_file(f"{out}/adapter/adapter_model.safetensors").items()}
    ref, ctl = torch.load(f"{d}/ref10_{name}.pt"), torch.load(f"{d}/ctl10_{name}.pt")
    t32 = torch.load(f"{d}/ref10_{name}_fp32.pt")
    if set(mine) != set(ref):
        bad.append(f"adapter names differ: fsdpd {sorted(set(mine) - set(ref))[:3]}, peft {sorted(set(ref) - set(mine))[:3]}")
    else:
        worst = max(((mine[k] - ref[k]).abs().max().item() / ref[k].abs().max().item(), k) for k in ref)
        w32 = max((t32[k].double() - ref[k]).abs().max().item() / ref[k].abs().max().item() for k in ref)
        print(f"{name} {out}: after {STEPS} steps the largest adapter difference from peft + AdamW in fp64 is "
              f"{worst[0]:.2e} of its tensor ({worst[1]}); torch's own in fp32: {w32:.2e}")
        if worst[0] > 1e-5:
            bad.append(f"{worst[1]} differs from peft + AdamW (fp64) by {worst[0]:.2e} of its largest (allowed 1e-5)")
        wctl = max((mine[k] - ctl[k]).abs().max().item() / ctl[k].abs().max().item() for k in ctl)
        print(f"{name} {out}: the control ({'the base un-quantized' if refs['nf4'] else 'the base trained too'}) is "
              f"{wctl:.2e} of its tensor away")
        if all(close(mine[k], ctl[k]) for k in ctl):
            bad.append(f"the control ({'the base un-quantized' if refs['nf4'] else 'the base trained too'}) is not "
                       "told from fsdpd's adapters")
    # the base: fsdpd's --save after training against the folder it was loaded from (QLoRA: against its
    # NF4 base dequantized, so that every code and scale is the one quantized at load), bit for bit
    src = f"{d}/deq_{name}.safetensors" if refs["nf4"] else f"{d}/{name}/model.safetensors"
    loaded, saved = load_file(src), load_file(f"{out}/base.safetensors")
    bare = lambda k: k[len("transformer."):] if k.startswith("transformer.") else k
    loaded = {bare(k): v for k, v in loaded.items() if not k.endswith(".attn.bias") and not k.endswith("masked_bias")}
    changed = [k for k, v in loaded.items() if k in saved and not torch.equal(saved[k], v)]
    absent = sorted(set(loaded) - set(saved))
    print(f"{name} {out}: {len(loaded) - len(absent)} of the {len(loaded)} loaded base tensors saved after training, "
          f"{len(changed)} changed")
    if changed:
        bad.append(f"the base tensor {changed[0]} changed in training ({len(changed)} did)")
    if absent:
        bad.append(f"the saved base lacks the loaded {absent[:3]}")
    # the folder loads with peft and holds fsdpd's weights
    base = (model_of(name, refs["nf4"]) if name in SETS["base"]
            else AutoModelForCausalLM.from_pretrained(f"{d}/{name}", dtype=torch.float32))
    pm = PeftModel.from_pretrained(base, f"{out}/adapter")
    for n, p in pm.named_parameters():
        k = n.replace(".default", "")
        if k in mine and not torch.equal(p.detach().double(), mine[k]):
            bad.append(f"PeftModel.from_pretrained gives another {k}")
            break
    for b in bad:
        print(f"FAIL: {name} {out}: {b}")
    return 1 if bad else 0


def merged(d, name, out, mdir):
    """QLoRA: against peft's merge over the dequantized NF4 base, far from its merge over the base
    un-quantized; otherwise (Phi-3's fused tensors) against peft's merge over the loaded base, far from
    the base alone."""
    refs = json.load(open(f"{d}/refs.json"))[name]
    bare = lambda k: k[len("transformer."):] if k.startswith("transformer.") else k
    mine = {bare(k): v for k, v in load_file(f"{mdir}/model.safetensors").items()}
    folder = lambda: AutoModelForCausalLM.from_pretrained(f"{d}/{name}", dtype=torch.float32)
    merge = lambda base: PeftModel.from_pretrained(base, f"{out}/adapter").merge_and_unload().state_dict()
    if refs["nf4"]:
        deq = model_of(name, True)
        deq.load_state_dict(load_file(f"{d}/deq_{name}.safetensors"), strict=False)
        ref, ctl, what = merge(deq), merge(model_of(name, True)), ("the NF4 base", "its merge over the base un-quantized")
    else:
        ref, ctl, what = merge(folder()), folder().state_dict(), ("the loaded base", "the base alone")
    dist = lambda sd: max((mine[bare(k)].double() - v.double()).abs().max().item() / max(v.abs().max().item(), 1e-30)
                          for k, v in sd.items() if bare(k) in mine)
    absent = [] if refs["nf4"] else [k for k in ref if bare(k) not in mine]   # (tied GPT-2's lm_head is no tensor of fsdpd's)
    worst, far = dist(ref), dist(ctl)
    print(f"{name} {mdir}: the merged folder is {worst:.2e} (of a tensor's largest) from peft's merge over {what[0]}, "
          f"{far:.2e} from {what[1]}")
    if worst > 1e-6 or far <= 1e-4 or absent:
        print(f"FAIL: {name} {mdir}: the merge is not peft's over {what[0]}{f' (it lacks {absent[:3]})' if absent else ''}")
        return 1
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
    elif sys.argv[1] == "merged":
        sys.exit(merged(*sys.argv[2:6]))
    else:
        sys.exit(verify(sys.argv[2], sys.argv[3], sys.argv[4]))
