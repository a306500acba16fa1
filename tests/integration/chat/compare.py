"""Chat templates rendered by fsdpd (jinja_tool) against transformers' own renderer.

  python compare.py JINJA_TOOL TEMPLATE_DIR [--list]

For every *.jinja in TEMPLATE_DIR and every conversation of CASES (with and without a system
prompt, several turns, empty content, non-ASCII and emoji, tool calls and results with a tool list),
transformers' render_jinja_template (what apply_chat_template calls; jinja2 of this environment)
renders it, and so does jinja_tool. They must agree byte for byte, including the
{% generation %} spans (transformers counts them in characters, jinja_tool in bytes) and whether
the template refuses the conversation (raise_exception, an error). A template jinja_tool refuses
at load is listed with the construct; one transformers itself cannot load is listed apart.
Exit status 1 when any template renders differently or fewer than MIN_FAMILIES families pass.
"""
import json
import os
import random
import re
import subprocess
import sys
import tempfile

from transformers.utils.chat_template_utils import render_jinja_template

MIN_FAMILIES = 10
SPECIAL = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]
U, A, S = "user", "assistant", "system"


def m(role, content):
    return {"role": role, "content": content}


CASES = {
    "single": ([m(U, "Hello!")], True, None),
    "system": ([m(S, "You are a helpful assistant."), m(U, "What is 2+2?")], True, None),
    "turns": ([m(U, "Hi"), m(A, "Hello, how can I help?"), m(U, "Tell me a joke."),
               m(A, "Why did the chicken cross the road?"), m(U, "Why?")], True, None),
    "turns_system_final": ([m(S, "Be brief."), m(U, "Name a colour."), m(A, "Blue."), m(U, "Another."),
                            m(A, "Red.")], False, None),
    "empty": ([m(S, ""), m(U, ""), m(A, ""), m(U, "")], True, None),
    "unicode": ([m(S, "Réponds en français, s'il te plaît."),
                 m(U, "Grüße aus München! 世界 🎉👩‍👩‍👧 naïve café — «quotes» \"double\" and 'single'\n\tindented"),
                 m(A, "Merci ! 😊 Ça va très bien.\n\nDeux lignes.")], False, None),
    "whitespace": ([m(U, "  padded  \n\n"), m(A, "\n answer with spaces  ")], False, None),
    "tools": ([m(S, "You can call tools."), m(U, "What's the weather in Paris?"),
               {"role": A, "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                   "name": "get_weather", "arguments": {"city": "Paris", "days": 1}}}]},
               {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
               m(A, "It is 21 °C in Paris.")], False, TOOLS),
    "tools_prompt": ([m(U, "Weather in Oslo?")], True, TOOLS),
    "two_users": ([m(U, "First question."), m(U, "And a second one?")], True, None),
    "long": ([m(S, "Count.")] + [x for k in range(4) for x in (m(U, f"n={k}"), m(A, str(k + 1)))], False, None),
    "reasoning": ([m(U, "Think: 2+3?"), {"role": A, "content": "5", "reasoning_content": "2 plus 3 is 5."},
                   m(U, "And 4+4?"), {"role": A, "content": "8", "reasoning_content": "Doubling 4."}], False, None),
}


def alias_reasoning(msgs):
    """transformers' _alias_reasoning_fields, which apply_chat_template applies before rendering
    (gen-data --chat does the same): a message's reasoning under any of its names is also under
    "thinking" (first) and "reasoning_content" (last)."""
    out = []
    for x in msgs:
        r = next((x[k] for k in ("reasoning_content", "thinking", "reasoning") if x.get(k) is not None), None)
        out.append(x if r is None else {"thinking": r, **x, "reasoning_content": r})
    return out



def random_cases(seed, n):
    """N conversations drawn from SEED: alternating turns with an optional system prompt, contents
    mixing ASCII, non-ASCII, emoji, Unicode spaces, quotes, backslashes, braces and newlines."""
    rnd = random.Random(seed)
    atoms = ["hello", "Grüße", "世界", "🎉", "👩‍👩‍👧", " ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u2028", "'", '"',
             "\\", "{{ x }}", "{%", "<|im_end|>", "</s>", "a.b", "1.5", "-", "_", "é", "ß", "İ", "\r\n", ""]
    out = {}
    for k in range(n):
        text = lambda: "".join(rnd.choice(atoms) for _ in range(rnd.randint(0, 6)))  # noqa: E731
        msgs = [m(S, text())] if rnd.random() < 0.5 else []
        for t in range(rnd.randint(1, 3)):
            msgs += [m(U, text()), m(A, text())]
        agp = rnd.random() < 0.5
        if agp:
            msgs.pop()
        out[f"random{k}"] = (msgs, agp, None)
    return out


CASES.update(random_cases(31, 24))

# Which model family each template belongs to (by its file name).
FAMILIES = [("llama", r"llama-3|Llama-3|firefunction|Hermes"), ("qwen", r"Qwen|QwQ"), ("mistral", r"istral|Devstral"),
            ("gemma", r"gemma"), ("deepseek", r"deepseek|DeepSeek"), ("phi", r"Phi"), ("granite", r"granite"),
            ("cohere", r"Cohere|command"), ("kimi", r"Kimi"), ("glm", r"GLM"), ("minimax", r"MiniMax"),
            ("smollm", r"SmolLM"), ("gpt-oss", r"gpt-oss"), ("lfm", r"LFM"), ("nemotron", r"Nemotron"),
            ("functionary", r"functionary"), ("gigachat", r"GigaChat"), ("apriel", r"Apriel"), ("mimo", r"MiMo"),
            ("seed", r"Seed"), ("apertus", r"Apertus"), ("bielik", r"Bielik"), ("minicpm", r"MiniCPM"),
            ("solar", r"Solar"), ("hunyuan", r"Hy3"), ("ling", r"ling"), ("laguna", r"Laguna"), ("step", r"StepFun"),
            ("reka", r"Reka"), ("rwkv", r"rwkv"), ("spark", r"Spark"), ("glimmer", r"glimmer")]


def family(name):
    for fam, rx in FAMILIES:
        if re.search(rx, name):
            return fam
    return name


def reference(tmpl, msgs, agp, tools):
    try:
        out, idx = render_jinja_template([msgs], tools=tools, chat_template=tmpl, add_generation_prompt=agp,
                                         return_assistant_tokens_mask=True, **SPECIAL)
    except Exception as e:  # noqa: BLE001 - any failure of the template is a result to compare
        return None, None, f"{type(e).__name__}: {e}"
    return out[0], idx[0], None


def variables(msgs, agp, tools):
    v = {"messages": alias_reasoning(msgs), "tools": tools, "documents": None, "add_generation_prompt": agp}
    v.update(SPECIAL)
    return v


def char_spans(text, spans):
    """Byte spans of TEXT's UTF-8 as character spans (transformers counts characters)."""
    b = text.encode()
    return [(len(b[:s].decode()), len(b[:e].decode())) for s, e in spans]


def compare(tool, path):
    """(status, detail) of one template: identical, refused, hf-cannot-load or different."""
    tmpl = open(path, encoding="utf-8").read()
    refs = {k: reference(tmpl, *c) for k, c in CASES.items()}
    if all(r[2] and ("TemplateSyntaxError" in r[2] or "TemplateAssertionError" in r[2]) for r in refs.values()):
        return "hf-cannot-load", next(iter(refs.values()))[2].splitlines()[0]
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False, encoding="utf-8") as f:
        for c in CASES.values():
            f.write(json.dumps(variables(*c), ensure_ascii=False) + "\n")
        vars_path = f.name
    try:
        p = subprocess.run([tool, path, vars_path], capture_output=True, text=True, encoding="utf-8", timeout=60)
    finally:
        os.unlink(vars_path)
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    if p.returncode == 2:
        return "refused", lines[0]["refused"]
    if p.returncode != 0 or len(lines) != len(CASES):
        return "different", f"jinja_tool failed (status {p.returncode}): {p.stderr.strip()}"
    agree = both_refuse = 0
    for (name, (out, idx, err)), got in zip(refs.items(), lines):
        if err is not None:
            if "error" not in got:
                return "different", f"{name}: transformers fails ({err.splitlines()[0]}), fsdpd renders"
            # raise_exception's message must come through; other failures (a type error, an
            # undefined value used as an object) need only fail on both sides
            if err.startswith("TemplateError: ") and "the template refused: " + err[15:] not in got["error"]:
                return "different", f"{name}: transformers raises {err!r}, fsdpd {got['error']!r}"
            both_refuse += 1
            continue
        if "error" in got:
            return "different", f"{name}: fsdpd fails ({got['error']}), transformers renders"
        if got["out"] != out:
            i = next((k for k in range(min(len(out), len(got["out"]))) if out[k] != got["out"][k]),
                     min(len(out), len(got["out"])))
            return "different", (f"{name}: first difference at character {i}: transformers "
                                 f"{out[max(0, i - 30):i + 30]!r}, fsdpd {got['out'][max(0, i - 30):i + 30]!r}")
        if [tuple(s) for s in char_spans(out, got["spans"])] != [tuple(s) for s in idx]:
            return "different", f"{name}: generation spans {idx} against {got['spans']}"
        agree += 1
    if not agree:
        return "none-rendered", f"transformers renders none of the conversations; fsdpd fails on all {both_refuse} too"
    return "identical", f"{agree} conversations identical, {both_refuse} refused by both"


def main():
    tool, tdir = sys.argv[1], sys.argv[2]
    names = sorted(n for n in os.listdir(tdir) if n.endswith(".jinja"))
    results = {n: compare(tool, os.path.join(tdir, n)) for n in names}
    for n, (st, d) in results.items():
        print(f"{st:15} {n}: {d}")
    fams = sorted({family(n) for n, (st, _) in results.items() if st == "identical"})
    kinds = ("identical", "refused", "none-rendered", "hf-cannot-load", "different")
    count = {s: sum(1 for st, _ in results.values() if st == s) for s in kinds}
    print(f"templates: {len(names)}; identical {count['identical']}, refused at load by fsdpd {count['refused']}, "
          f"no conversation rendered by either {count['none-rendered']}, not loadable by transformers "
          f"{count['hf-cannot-load']}, different {count['different']}")
    print(f"families rendered byte-identically: {len(fams)}: {', '.join(fams)}")
    if count["different"] or len(fams) < MIN_FAMILIES:
        sys.exit(1)


if __name__ == "__main__":
    main()
