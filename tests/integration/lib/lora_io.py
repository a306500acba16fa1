# The peft side of lora_resume.sh and lora_export.sh (scripts/test-env.sh's python: torch, transformers 5,
# peft); the models are lora_peft.py's (tiny GPT-2 and Llama, fp32).
#   lora_io.py build DIR      DIR/gpt2, DIR/llama (save_pretrained), DIR/train.bin, and for each an adapter
#                             folder DIR/init_M to start from (peft's LoRA on attention and MLP, B made
#                             non-zero, so that the adapters change the logits from step 1)
#   lora_io.py perturb FILE   add 1e-3 to one weight of a model.safetensors in place (a base that changed)
#   lora_io.py logits BASE ADAPTER|- PROMPT OUT.json   PeftModel.from_pretrained(BASE, ADAPTER)'s logits of the
#                             prompt's bytes (ADAPTER "-": the base alone; BASE a merged folder: from_pretrained)
#   lora_io.py close REF.json GOT.json TOL   max |got - ref| <= TOL * max |ref|, printed either way
import copy, json, os, sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from lora_peft import ALPHA, R, TARGETS, model_of, tokens, write_tokens  # noqa: E402

torch.set_num_threads(1)


def build(d):
    write_tokens(f"{d}/train.bin", tokens(20 * 4 * 32 + 1))
    for name in ("gpt2", "llama"):
        base = model_of(name)
        base.save_pretrained(f"{d}/{name}", safe_serialization=True)
        cfg = LoraConfig(r=R, lora_alpha=ALPHA, lora_dropout=0.0, target_modules=TARGETS[name],
                         fan_in_fan_out=name == "gpt2", task_type="CAUSAL_LM")
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


def logits(base, adapter, prompt, out):
    m = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32).eval()
    if adapter != "-":
        m = PeftModel.from_pretrained(m, adapter).eval()
    ids = torch.tensor([list(prompt.encode())])
    with torch.no_grad():
        lg = m(input_ids=ids).logits[0].double()
    json.dump(lg.tolist(), open(out, "w"))


def close(ref, got, tol):
    a, b = torch.tensor(json.load(open(ref))), torch.tensor(json.load(open(got)))
    if a.shape != b.shape:
        print(f"{got}: shape {tuple(b.shape)}, {ref}: {tuple(a.shape)}")
        return 1
    d = (a - b).abs().max().item() / a.abs().max().item()
    print(f"{got} vs {ref}: largest difference {d:.2e} of the largest logit (allowed {tol:g})")
    return 0 if d <= tol else 1


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "build":
        build(sys.argv[2])
    elif cmd == "perturb":
        perturb(sys.argv[2])
    elif cmd == "logits":
        logits(*sys.argv[2:6])
    else:
        sys.exit(close(sys.argv[2], sys.argv[3], float(sys.argv[4])))
