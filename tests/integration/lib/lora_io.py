# The peft side of lora_resume.sh and lora_export.sh (scripts/test-env.sh's python: torch, transformers 5,
# peft); the models are lora_peft.py's (tiny GPT-2 and Llama, fp32).
#   lora_io.py build DIR      DIR/gpt2, DIR/llama (save_pretrained), DIR/train.bin, and for each an adapter
#                             folder DIR/init_M to start from (peft's LoRA on attention and MLP, B made
#                             non-zero, so that the adapters change the logits from step 1)
#   lora_io.py build DIR wide the same with every width a multiple of 64 (lora_peft.py's wide models, as
#                             [lora] base_dtype = nf4 needs): DIR/gpt2_w, DIR/llama_w and their init_M
#   lora_io.py perturb FILE   add 1e-3 to one weight of a model.safetensors in place (a base that changed)
#   lora_io.py verify BASE PEFT MERGED PROMPT FSDPD.json...   the reference, PeftModel.from_pretrained(BASE,
#                             PEFT)'s logits of the prompt's bytes, against fsdpd's (fsdpctl sample --logits) and
#                             from_pretrained(MERGED)'s: max |got - ref| <= 1e-5 · max |ref|; and the control, the
#                             base alone, more than 1e-3 away
import copy, json, math, os, sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_peft import ALPHA, R, TARGETS, model_of, tokens, write_tokens  # noqa: E402

torch.set_num_threads(1)


def build(d, wide=False):
    write_tokens(f"{d}/train.bin", tokens(20 * 4 * 32 + 1))
    for name in ("gpt2", "llama"):
        base = model_of(name, wide)
        if wide:
            name += "_w"
        base.save_pretrained(f"{d}/{name}", safe_serialization=True)
        cfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS[name.removesuffix("_w")],
                         fan_in_fan_out=name.startswith("gpt2"), task_type="CAUSAL_LM")
        pm = get_peft_model(copy.deepcopy(base), cfg)
        torch.manual_seed(11)
        with torch.no_grad():
            for n, p in pm.named_parameters():
                if "lora_B" in n:
                    p.normal_(0.0, 1.0)
        pm.save_pretrained(f"{d}/init_{name}")


def perturb(path):
    t = load_file(path)
    k = sorted(k for k in t if t[k].dim() == 2)[0]
    t[k] = t[k].clone()
    t[k].view(-1)[0] += 1e-3
    save_file(t, path, metadata={"format": "pt"})


def logits(base, adapter, prompt):
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter:
        m = PeftModel.from_pretrained(m, adapter).eval()
    ids = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        return m(input_ids=ids).logits[0].double()


def verify(base, peft, merged, prompt, *fsdpd):
    ref = logits(base, peft, prompt)
    got = {f: torch.tensor(json.load(open(f)), dtype=torch.float64) for f in fsdpd}
    got[f"from_pretrained({merged})"] = logits(merged, None, prompt)
    bad = 0
    for name, g in got.items():
        d = (g - ref).abs().max().item() / ref.abs().max().item() if g.shape == ref.shape else math.inf
        print(f"{name} vs PeftModel.from_pretrained({base}, {peft}): largest difference {d:.2e} of the largest "
              f"logit (allowed 1e-05)")
        bad |= not d <= 1e-5
    d = (logits(base, None, prompt) - ref).abs().max().item() / ref.abs().max().item()
    print(f"control, {base} alone: {d:.2e} of the largest logit away (must be above 1e-03)")
    bad |= not d > 1e-3
    return 1 if bad else 0


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(sys.argv[2], sys.argv[3:] == ["wide"])
    elif cmd == "perturb":
        perturb(sys.argv[2])
    else:
        sys.exit(verify(*sys.argv[2:]))
