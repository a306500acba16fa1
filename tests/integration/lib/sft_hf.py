# The transformers side of sft_hf.sh (run with scripts/test-env.sh's python: torch, transformers 5).
#   sft_hf.py build DIR   two tiny model folders (GPT-2 and Llama, sharpened as in hf_finetune.py so that
#                         the loss depends on positions and on what each token sees), a masked token file
#                         of short conversations (a prompt that is not trained, an answer that is), and
#                         DIR/refs.json: for pack = true and pack = false, transformers' loss of the step's
#                         rows with labels = -100 and per-document attention (a 4-D mask and position_ids
#                         restarting in each document), the loss averaged over the trained tokens of the
#                         whole step (num_items_in_batch), the grad_clip that clips that step, and the
#                         controls (documents that see each other, positions that run on, the mean of
#                         per-micro-batch means); the weights after one AdamW step in DIR/ref-*.safetensors
#   sft_hf.py verify DIR NAME PACK   fsdpd's export after the step (DIR/exp-NAME-PACK) against them
import json, os, struct, sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_finetune import LO, HI, V, llama, save_tokenizer, sharpen  # noqa: E402

T, WORLD, B, G = 32, 2, 1, 2          # the job: seq_len, ranks, rows per rank, micro-steps
LR, EPS = 0.05, 1.0                   # eps 1: the update is ~lr·g, so the weights show the gradient's scale
RTOL = 1e-5
torch.set_num_threads(1)


def documents(seed):
    """Conversations of 5-16 tokens: a copy task (a random half, then the same half again, so that the
    answer needs to see its own prompt at the right positions); the prompt untrained, the answer trained,
    with prompts of varying length so that the micro-batches train different numbers of tokens."""
    g = torch.Generator().manual_seed(seed)
    docs = []
    for _ in range(48):
        h = int(torch.randint(3, 9, (1,), generator=g))
        half = torch.randint(LO, HI, (h,), generator=g).tolist()
        toks = half + half[: int(torch.randint(2, h + 1, (1,), generator=g))]
        docs.append((toks, [0] * h + [1] * (len(toks) - h)))
    return docs


def write_masked(path, docs):
    toks = [t for d, _ in docs for t in d]
    mask = [m for _, ms in docs for m in ms]
    starts = [int(i == 0) for d, _ in docs for i in range(len(d))]
    def bits(v):
        out = bytearray((len(v) + 7) // 8)
        for i, b in enumerate(v):
            out[i // 8] |= b << (i % 8)
        return bytes(out)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", 20240520, 2, len(toks), *[0] * 253))
        f.write(struct.pack(f"<{len(toks)}H", *toks) + bits(mask) + bits(starts))


def pack_rows(docs, pack):
    """The loader's rows (docs/data.md): whole documents back to back, or one per row."""
    rows, cur = [], []
    for d in docs:
        if cur and (not pack or sum(len(x[0]) for x in cur) + len(d[0]) > T):
            rows.append(cur)
            cur = []
        cur.append(d)
    rows.append(cur)
    return rows


def row_tensors(row, docs_see_each_other=False, positions_run_on=False):
    """input_ids, labels (-100: not trained; a document's first token is never the target of the one
    before it), position_ids and the 4-D additive mask (0: may attend, the float minimum: may not) of one row, padded to T."""
    ids, labels, pos, doc = [], [], [], []
    for k, (toks, mask) in enumerate(row):
        for i, (t, m) in enumerate(zip(toks, mask)):
            ids.append(t)
            labels.append(t if m and i > 0 else -100)
            pos.append(i)
            doc.append(k)
    while len(ids) < T:
        ids.append(0), labels.append(-100), pos.append(pos[-1] + 1), doc.append(doc[-1])
    if positions_run_on:
        pos = list(range(T))
    d = torch.tensor(doc)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    allowed = causal if docs_see_each_other else causal & (d[:, None] == d[None, :])
    additive = torch.zeros(T, T).masked_fill(~allowed, torch.finfo(torch.float32).min)   # eager adds it
    return torch.tensor(ids), torch.tensor(labels), torch.tensor(pos), additive


def step_rows(rows):
    """The step's rows by (micro-step k, rank r): row ((k mod nb)·WORLD + r)·B + i, as tokens.h orders them."""
    nb = len(rows) // (WORLD * B)
    assert nb >= G, f"{len(rows)} rows: too few for {G} micro-steps"
    return {(k, r): [rows[((k % nb) * WORLD + r) * B + i] for i in range(B)] for k in range(G) for r in range(WORLD)}


def micro_sums(model, mb, **ctl):
    """Per micro-batch: Σ of the token losses (transformers' shift: labels[t] predicts from t-1), its
    trained tokens."""
    out = {}
    for key, rs in mb.items():
        x, y, p, m = zip(*(row_tensors(r, **ctl) for r in rs))
        x, y, p, m = torch.stack(x), torch.stack(y), torch.stack(p), torch.stack(m)[:, None]
        logits = model(input_ids=x, position_ids=p, attention_mask=m).logits.float()
        sl, ll = logits[:, :-1].reshape(-1, V), y[:, 1:].reshape(-1)
        out[key] = (torch.nn.functional.cross_entropy(sl, ll, ignore_index=-100, reduction="sum"),
                    int((ll != -100).sum()))
    return out


def loss_of(model, mb, mean_of_means=False, **ctl):
    s = micro_sums(model, mb, **ctl)
    if mean_of_means:
        return sum(a / n for a, n in s.values()) / len(s)
    return sum(a for a, _ in s.values()) / sum(n for _, n in s.values())   # num_items_in_batch


def adamw_step(model, loss, clip):
    """One step of fsdpd's AdamW as torch runs it: clip_grad_norm_, then AdamW (no decay here)."""
    model.zero_grad()
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip).item()
    opt = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), eps=EPS, weight_decay=0.0)
    opt.step()
    return norm


def hf_names(model):
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}


def build(root):
    docs = documents(3)
    write_masked(f"{root}/train.bin", docs)
    refs = {}
    for name in ("gpt2", "llama"):
        torch.manual_seed(1)
        if name == "gpt2":
            model = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                                               bos_token_id=1, eos_token_id=2))
        else:
            model = LlamaForCausalLM(llama())
        sharpen(model)
        d = f"{root}/{name}"
        model.save_pretrained(d)
        save_tokenizer(d)
        for pack in (True, False):
            ref = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
            mb = step_rows(pack_rows(docs, pack))
            ndocs = sum(len(r) for rs in mb.values() for r in rs)
            with torch.no_grad():
                ctl = {"mean of per-micro-batch means": loss_of(ref, mb, mean_of_means=True).item()}
                if pack:
                    ctl["documents that see each other"] = loss_of(ref, mb, docs_see_each_other=True).item()
                if pack and name == "gpt2":   # rope is relative: inside its document a Llama cannot tell
                    ctl["positions that run on"] = loss_of(ref, mb, positions_run_on=True).item()
            loss = loss_of(ref, mb)
            # clip at half the norm: clipping is on, and it needs the right average's norm
            ref.zero_grad()
            loss.backward(retain_graph=True)
            gnorm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in ref.parameters())).item()
            clip = gnorm / 2
            adamw_step(ref, loss, clip)
            tag = f"{name}-{'pack' if pack else 'nopack'}"
            save_file(hf_names(ref), f"{root}/ref-{tag}.safetensors")
            # the weights after the control step: fsdpd's must be told from them
            bad = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager")
            adamw_step(bad, loss_of(bad, mb, mean_of_means=True), clip)
            save_file(hf_names(bad), f"{root}/bad-{tag}.safetensors")
            refs[tag] = {"loss": loss.item(), "grad_clip": clip, "grad_norm": gnorm, "controls": ctl,
                         "docs": ndocs, "trained": sum(n for _, n in micro_sums(ref, mb).values())}
    json.dump(refs, open(f"{root}/refs.json", "w"), indent=1)


def verify(root, name, pack):
    tag = f"{name}-{pack}"
    exp = f"{root}/exp-{tag}"
    got = {}
    for fn in os.listdir(exp):
        if fn.endswith(".safetensors"):
            got.update(load_file(f"{exp}/{fn}"))
    d0 = {}
    for fn in os.listdir(f"{root}/{name}"):
        if fn.endswith(".safetensors"):
            d0.update(load_file(f"{root}/{name}/{fn}"))
    bad = []
    for which in ("ref", "bad"):
        want = load_file(f"{root}/{which}-{tag}.safetensors")
        worst = 0.0
        for k, w in want.items():
            gk = k if k in got else k.removeprefix("transformer.")   # fsdpd writes GPT-2's names as OpenAI did
            if gk not in got:
                if which == "ref" and not k.endswith("lm_head.weight"):   # GPT-2's tied head is wte
                    bad.append(f"{tag}: the export lacks {k}")
                continue
            w0, g1, w1 = d0[k].double(), got[gk].double(), w.double()
            dw, dg = w1 - w0, g1 - w0   # the step's update, where the average shows
            if dw.abs().max() == 0:
                continue
            # both weights are stored in fp32: their difference carries an ulp of each beside RTOL
            ulp = torch.finfo(torch.float32).eps * (w1.abs() + w0.abs())
            err = (((dg - dw).abs() - ulp).clamp(min=0).max() / dw.abs().max()).item()
            worst = max(worst, err)
        print(f"{tag}: fsdpd's weights after the step vs transformers' ({which}): worst relative difference "
              f"{worst:.2e} (of the weights and of the update)")
        if which == "ref" and worst > RTOL:
            bad.append(f"{tag}: the weights after the step differ from transformers' by {worst:.3g} relative")
        if which == "bad" and worst <= RTOL * 100:
            bad.append(f"{tag}: the control step (mean of per-micro-batch means) is not told from fsdpd's "
                       f"({worst:.3g})")
    for b in bad:
        print("FAIL:", b)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    if sys.argv[1] == "build":
        build(sys.argv[2])
    else:
        verify(sys.argv[2], sys.argv[3], sys.argv[4])
