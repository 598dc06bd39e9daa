#!/usr/bin/env python3
"""Turns chat or instruction data into TierMoE's tokenized SFT JSON Lines.

Input: JSON (an array of records) or JSON Lines, each record either
  chat:         {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
  instruction:  {"instruction": "...", "input": "..." (optional), "output": "...",
                 "system": "..." (optional)}
(an instruction record becomes the chat [system], user: instruction + "\\n\\n" + input,
assistant: output).

Output: one line per example, {"input_ids": [...], "labels": [...]}, the conversation
rendered with the tokenizer's chat template and tokenized; labels are the ids of the
assistant turns (their content and the template's end-of-turn tokens) and -100
everywhere else, so only the assistant's replies carry loss (README, "Fine-tuning on
SFT data").

Which tokens are the assistant's: the template is rendered for the conversation up to
each assistant turn (with the generation prompt) and up to its end; the characters in
between are that turn. Templates that render earlier turns differently once later
ones follow (e.g. some drop reasoning from history) are caught by a prefix check; for
those, templates with {% generation %} blocks use the tokenizer's own
return_assistant_tokens_mask (--mask generation).

Dependencies (transformers, tokenizers, jinja2) are installed on first use into a
virtual environment under ~/.cache/tiermoe/venv (TIERMOE_VENV overrides), and the
script re-runs itself there. Not part of `make test`.

  scripts/prep_sft.py --tokenizer Qwen/Qwen3-30B-A3B --in chat.jsonl --out sft.jsonl
  scripts/prep_sft.py --tokenizer ./my_tokenizer_dir --in alpaca.json --out sft.jsonl --max-len 2048
"""
import argparse
import json
import os
import subprocess
import sys

DEPS = ["transformers", "tokenizers", "jinja2"]


def venv_dir():
    return os.environ.get("TIERMOE_VENV",
                          os.path.join(os.path.expanduser("~"), ".cache", "tiermoe", "venv"))


def ensure_deps():
    """Imports transformers, or installs the dependencies into the venv and re-runs there."""
    try:
        import transformers  # noqa: F401
        import jinja2  # noqa: F401
        return
    except ImportError:
        pass
    if os.environ.get("TIERMOE_PREP_SFT_IN_VENV"):
        sys.exit("error: the dependencies are still missing inside " + venv_dir() +
                 "; hint: delete that directory and run again")
    venv = venv_dir()
    py = os.path.join(venv, "bin", "python")
    if not os.path.exists(py):
        print(f"prep_sft: creating {venv} (first use)", file=sys.stderr)
        subprocess.check_call([sys.executable, "-m", "venv", venv])
    have = subprocess.call([py, "-c", "import transformers, tokenizers, jinja2"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) == 0
    if not have:
        print("prep_sft: installing " + ", ".join(DEPS) + " into " + venv, file=sys.stderr)
        # torch is not needed: the tokenizer and its template run without it.
        subprocess.check_call([py, "-m", "pip", "install", "--quiet", *DEPS])
    env = dict(os.environ, TIERMOE_PREP_SFT_IN_VENV="1")
    os.execve(py, [py, os.path.abspath(__file__), *sys.argv[1:]], env)


def read_records(path):
    with open(path, encoding="utf-8") as f:
        text = f.read()
    stripped = text.lstrip()
    if stripped.startswith("["):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {path}: not valid JSON ({e}); hint: give a JSON array "
                             "or JSON Lines")
        for i, r in enumerate(data):
            yield f"{path}: record {i + 1}", r
        return
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield f"{path}:{n}", json.loads(line)
        except json.JSONDecodeError as e:
            raise SystemExit(f"error: {path}:{n}: not a JSON object ({e}); hint: one record "
                             "per line")


def to_messages(where, r, system):
    if not isinstance(r, dict):
        raise SystemExit(f"error: {where}: a record must be an object; hint: see --help")
    if "messages" in r:
        msgs = r["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise SystemExit(f"error: {where}: 'messages' must be a non-empty list")
        for m in msgs:
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise SystemExit(f"error: {where}: every message needs 'role' and 'content'")
        if system and msgs[0]["role"] != "system":
            msgs = [{"role": "system", "content": system}] + msgs
        return msgs
    if "instruction" in r and "output" in r:
        user = str(r["instruction"])
        if r.get("input"):
            user += "\n\n" + str(r["input"])
        msgs = []
        sys_text = r.get("system") or system
        if sys_text:
            msgs.append({"role": "system", "content": sys_text})
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": str(r["output"])}]
        return msgs
    raise SystemExit(f"error: {where}: neither 'messages' nor 'instruction'/'output'; hint: "
                     "give chat records or instruction records (see --help)")


def render(tok, msgs, generation_prompt=False):
    return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=generation_prompt)


def assistant_spans(where, tok, msgs):
    """The full rendered text and the character spans of the assistant turns."""
    full = render(tok, msgs)
    spans = []
    for i, m in enumerate(msgs):
        if m["role"] != "assistant":
            continue
        before = render(tok, msgs[:i], generation_prompt=True) if i else ""
        upto = render(tok, msgs[:i + 1])
        if not (full.startswith(upto) and upto.startswith(before)):
            raise ValueError(f"{where}: the chat template renders turn {i + 1} differently once "
                             "later turns follow")
        spans.append((len(before), len(upto)))
    return full, spans


def tokenize_incremental(where, tok, msgs):
    full, spans = assistant_spans(where, tok, msgs)
    enc = tok(full, add_special_tokens=False, return_offsets_mapping=True)
    ids = enc["input_ids"]
    labels = []
    for tid, (b, e) in zip(ids, enc["offset_mapping"]):
        inside = any(s <= b < t for s, t in spans) and e > b
        labels.append(tid if inside else -100)
    return ids, labels


def tokenize_generation(tok, msgs):
    out = tok.apply_chat_template(msgs, tokenize=True, return_dict=True,
                                  return_assistant_tokens_mask=True)
    ids = list(out["input_ids"])
    mask = list(out["assistant_masks"])
    return ids, [t if m else -100 for t, m in zip(ids, mask)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n", 1)[1])
    ap.add_argument("--tokenizer", required=True,
                    help="a Hugging Face hub id or a local directory with the tokenizer files")
    ap.add_argument("--in", dest="inputs", action="append", required=True,
                    help="input JSON or JSON Lines (repeatable)")
    ap.add_argument("--out", required=True, help="output JSON Lines")
    ap.add_argument("--max-len", type=int, default=0,
                    help="keep the first N tokens of longer examples (0: keep all; TierMoE also "
                         "cuts at --seq-len)")
    ap.add_argument("--system", default="", help="a system prompt for records without one")
    ap.add_argument("--mask", choices=["auto", "incremental", "generation"], default="auto",
                    help="how assistant tokens are found (auto: incremental, else the "
                         "template's {%% generation %%} blocks)")
    ap.add_argument("--chat-template", default="",
                    help="a Jinja chat template file to use instead of the tokenizer's")
    args = ap.parse_args()
    if args.max_len < 0:
        raise SystemExit("error: --max-len must be >= 0")
    ensure_deps()
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(args.tokenizer)
    except Exception as e:  # the hub unreachable, a wrong id or directory
        reason = " ".join(str(e).split())
        raise SystemExit(f"error: --tokenizer {args.tokenizer}: cannot load it ({reason}); hint: "
                         "give a local directory with tokenizer.json and tokenizer_config.json "
                         "when the hub is unreachable")
    if args.chat_template:
        with open(args.chat_template, encoding="utf-8") as f:
            tok.chat_template = f.read()
    if not tok.chat_template:
        raise SystemExit(f"error: --tokenizer {args.tokenizer} has no chat template; hint: pass "
                         "--chat-template FILE")
    if args.mask != "generation" and not tok.is_fast:
        raise SystemExit("error: --mask incremental needs a fast tokenizer (offsets); hint: use "
                         "--mask generation with a template that has {% generation %} blocks")

    n_out = n_cut = n_empty = n_tokens = n_trained = 0
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for path in args.inputs:
            for where, rec in read_records(path):
                msgs = to_messages(where, rec, args.system)
                mode = args.mask
                if mode in ("auto", "incremental"):
                    try:
                        ids, labels = tokenize_incremental(where, tok, msgs)
                    except ValueError as e:
                        if mode == "incremental" or "{% generation %}" not in tok.chat_template:
                            raise SystemExit(f"error: {e}; hint: use a template with "
                                             "{% generation %} blocks and --mask generation")
                        ids, labels = tokenize_generation(tok, msgs)
                else:
                    ids, labels = tokenize_generation(tok, msgs)
                if args.max_len and len(ids) > args.max_len:
                    ids, labels = ids[:args.max_len], labels[:args.max_len]
                    n_cut += 1
                trained = sum(1 for x in labels[1:] if x != -100)
                if trained == 0:
                    n_empty += 1  # nothing to learn from (no assistant turn, or cut away)
                    continue
                out.write(json.dumps({"input_ids": ids, "labels": labels}) + "\n")
                n_out += 1
                n_tokens += len(ids)
                n_trained += trained
    os.replace(tmp, args.out)
    print(f"prep_sft: {n_out} examples, {n_tokens} tokens ({n_trained} with loss) -> {args.out}"
          f"; {n_cut} cut at --max-len, {n_empty} skipped with no assistant tokens",
          file=sys.stderr)


if __name__ == "__main__":
    main()
