"""Builders of single editor events (editor_event.v1 dicts) from real code windows.

Each builder is given a random generator and a code window and returns the
event as the editor client would log it. The conventions here are the ones the
extract stage relies on (documented in `schemas/editor_event.v1.json`):

- `context.prefix` / `context.suffix` are the file window split at the cursor;
- a tab completion's file after acceptance is `prefix + accepted text + suffix`;
- an inline edit's `diff` is a unified diff against `prefix + suffix` (the
  selection starts at the cursor, so it is the head of `suffix`).
"""
from __future__ import annotations

import difflib
import itertools
import json
import random
import re

_IDENT = re.compile(r"\b[a-z_][a-z0-9_]{3,}\b")
_KEYWORDS = {"self", "return", "import", "from", "class", "while", "with", "yield", "raise", "except",
             "finally", "lambda", "assert", "global", "pass", "break", "continue", "elif", "else", "none",
             "true", "false", "async", "await", "def", "for", "not", "and", "del", "try", "print", "super",
             "struct", "const", "static", "void", "char", "define", "include", "endif", "ifdef", "ifndef",
             "function", "let", "var", "this", "public", "private", "package", "func", "impl"}

EDIT_INSTRUCTIONS = [
    "add a comment explaining this", "rename the variable to something clearer", "add logging here",
    "handle the None case", "make this more readable", "add type hints", "simplify this block",
]
CHAT_QUESTIONS = [
    "What does `{name}` do here, and is there an edge case I'm missing?",
    "Can you explain this code?",
    "Why would `{name}` be slow on large inputs?",
    "Is this thread-safe?",
    "How do I write a unit test for `{name}`?",
    "Refactor this to be easier to read, please.",
    "¿Puedes explicar qué hace `{name}`?",
    "このコードの `{name}` は何をしていますか？",
]
AGENT_TASKS = [
    "Fix the failing test for {name}",
    "Add input validation to {name}",
    "The CI is red after my last change in {path}; please investigate and fix it",
    "Refactor {name} to remove the duplicated branch",
    "Add a docstring and type hints to {name}",
]


def weighted(rng: random.Random, table: tuple[tuple[str, float], ...]) -> str:
    """A name drawn from (name, weight) pairs."""
    x = rng.random() * sum(w for _, w in table)
    for name, w in table:
        x -= w
        if x < 0:
            return name
    return table[-1][0]


def _names(text: str) -> list[str]:
    return [m for m in dict.fromkeys(_IDENT.findall(text)) if m not in _KEYWORDS]


def _lines(text: str) -> list[str]:
    """Lines split on "\n" only, like diff tools (form feeds stay inside a line)."""
    parts = text.split("\n")
    out = [p + "\n" for p in parts[:-1]]
    if parts[-1]:
        out.append(parts[-1])
    return out


def _line_offsets(text: str) -> list[int]:
    """Character offsets of line starts (plus the end), lines split on "\n" only."""
    parts = text.split("\n")
    offs = [0, *itertools.accumulate(len(p) + 1 for p in parts[:-1])]
    if parts[-1]:
        offs.append(len(text))
    return offs


def split_for_completion(rng: random.Random, text: str, *, mode: str = "normal") -> tuple[str, str, str]:
    """Cut a window into (prefix, true completion, suffix).

    `mode`: "normal" (cursor inside), "empty_prefix" (cursor at 0), "eof" (completion ends the file),
    "midline" (cursor inside a line, completion = rest of the line).
    """
    offs = _line_offsets(text)
    n = len(offs) - 1
    if n < 3:
        c = len(text) // 2
        return text[:c], text[c:], ""
    if mode == "empty_prefix":
        end = offs[min(n, rng.randint(1, 3))]
        return "", text[:end], text[end:]
    if mode == "eof":
        start = offs[max(1, n - rng.randint(1, 3))]
        return text[:start], text[start:], ""
    k = rng.randint(1, n - 2)
    if mode == "midline":
        line = text[offs[k]:offs[k + 1]]
        stripped = len(line) - len(line.lstrip())
        if len(line.strip()) > 8:
            cut = offs[k] + stripped + rng.randint(2, len(line.strip()) - 2)
            return text[:cut], text[cut:offs[k + 1]], text[offs[k + 1]:]
    m = rng.randint(1, min(4, n - k - 1))
    return text[:offs[k]], text[offs[k]:offs[k + m]], text[offs[k + m]:]


def wrong_completion(rng: random.Random, text: str, truth: str) -> str:
    """A plausible but wrong suggestion: real lines from elsewhere in the window, or a truncation."""
    lines = [ln for ln in text.splitlines(keepends=True) if ln.strip()]
    for _ in range(5):
        if not lines:
            break
        i = rng.randrange(len(lines))
        cand = "".join(lines[i:i + max(1, truth.count("\n"))])
        if cand and cand != truth:
            return cand
    return truth[: max(1, len(truth) // 2)] + "pass\n" if truth != "pass\n" else "return None\n"


def partial_of(rng: random.Random, suggestion: str) -> str:
    """What a partial acceptance keeps: the first line, or the first few words (Ctrl+Right)."""
    first, nl, _ = suggestion.partition("\n")
    if nl and rng.random() < 0.5 and suggestion.count("\n") > 1:
        return first + "\n"
    words = re.findall(r"\s*\S+", first)
    if len(words) <= 1:
        return first[: max(1, len(first) // 2)] if len(first) > 1 else suggestion[:1]
    return "".join(words[: rng.randint(1, len(words) - 1)])


def edit_region(rng: random.Random, region: str, language: str) -> tuple[str, str]:
    """(instruction, edited region): the kind of small edit an inline-edit request produces."""
    instr = rng.choice(EDIT_INSTRUCTIONS)
    lines = _lines(region)
    c = "#" if language in ("python", "shell", "yaml") else "//"
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())] if lines else ""
    names = _names(region)
    if instr.startswith("rename") and names:
        old = rng.choice(names)
        return instr, re.sub(rf"\b{re.escape(old)}\b", old + "_value", region)
    if instr.startswith("add logging") and language == "python":
        return instr, f"{indent}logger.debug(\"entering block\")\n" + region
    if instr.startswith("handle the None") and language == "python" and names:
        return instr, f"{indent}if {names[0]} is None:\n{indent}    return None\n" + region
    note = {"add a comment explaining this": "Keep the original order: callers rely on it.",
            "add type hints": "Types are documented in the module docstring."}.get(instr, "Simplified; behaviour unchanged.")
    edited = f"{indent}{c} {note}\n" + "".join(ln.rstrip() + "\n" if ln.endswith("\n") else ln.rstrip() for ln in lines)
    if edited == f"{indent}{c} {note}\n" + region and rng.random() < 0.5:
        edited = edited.replace("  ", " ", 1)
    return instr, edited


_RANGE = re.compile(r"^@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def unified_diff(path: str, before: str, after: str, *, around: tuple[int, int, int] | None = None) -> str:
    """A `git diff`-style unified diff (3 lines of context) of one file.

    `around=(a, b_old, b_new)` says the change is confined to lines a..b_old of
    `before` (a..b_new of `after`): difflib then only looks at that window plus
    context, which is what makes diffs of large files cheap; the hunk headers
    are shifted back to whole-file line numbers, so the result is the same patch.
    """
    a_lines, b_lines = _lines(before), _lines(after)
    lo = 0
    if around is not None:
        start, end_old, end_new = around
        lo = max(0, start - 3)
        a_lines, b_lines = a_lines[lo:end_old + 3], b_lines[lo:end_new + 3]
    out = []
    for line in difflib.unified_diff(a_lines, b_lines, fromfile=f"a/{path}", tofile=f"b/{path}", n=3):
        if lo and line.startswith("@@"):
            m = _RANGE.match(line)
            line = f"@@ -{int(m.group(1)) + lo}{m.group(2)} +{int(m.group(3)) + lo}{m.group(4)} @@\n"
        if not line.endswith("\n"):
            line += "\n\\ No newline at end of file\n"
        out.append(line)
    return "".join(out)


def chat_messages(rng: random.Random, text: str, language: str, path: str) -> list[dict]:
    """One or two user/assistant exchanges about a snippet of the window."""
    lines = text.splitlines(keepends=True)
    a = rng.randrange(max(1, len(lines) - 8))
    snippet = "".join(lines[a:a + rng.randint(6, 16)])
    names = _names(snippet) or ["this"]
    name = rng.choice(names)
    q = rng.choice(CHAT_QUESTIONS).format(name=name)
    msgs = []
    if rng.random() < 0.3:
        msgs.append({"role": "system", "content": f"You are an expert {language} programmer. The user is editing {path}.", "tool_name": None})
    msgs.append({"role": "user", "content": f"{q}\n\n```{language}\n{snippet}```", "tool_name": None})
    other = [n for n in names if n != name][:3]
    answer = (
        f"`{name}` is used in this block to keep track of intermediate state. "
        + (f"It interacts with {', '.join('`%s`' % o for o in other)}. " if other else "")
        + rng.choice([
            "The edge case to watch is an empty input: the loop body never runs, so the default is returned.",
            "It runs in linear time in the size of the input; the expensive part is the repeated lookup.",
            "It is not thread-safe on its own: two callers can interleave between the check and the update.",
            "A small test can call it with a minimal input and assert on the returned value.",
        ])
        + f"\n\nHere is a slightly tidier version:\n\n```{language}\n{snippet.rstrip()}\n```\n"
    )
    msgs.append({"role": "assistant", "content": answer, "tool_name": None})
    if rng.random() < 0.35:
        msgs.append({"role": "user", "content": rng.choice(["Thanks! Can you add a test too?", "Merci, ça marche 👍 — and the docstring?", "ok, shorter please"]), "tool_name": None})
        msgs.append({"role": "assistant", "content": f"Sure:\n\n```{language}\n# test for {name}\n```\n", "tool_name": None})
    return msgs


def agent_messages(rng: random.Random, text: str, language: str, path: str, diff: str) -> list[dict]:
    """An agent step: task, tool calls (read, edit, test) with their outputs, and a summary."""
    names = _names(text) or ["main"]
    name = rng.choice(names)
    task = rng.choice(AGENT_TASKS).format(name=name, path=path)
    msgs = [
        {"role": "system", "content": "You are a coding agent. Use the tools to inspect and change the repository.", "tool_name": None},
        {"role": "user", "content": task, "tool_name": None},
        {"role": "assistant", "content": json.dumps({"path": path}), "tool_name": "read_file"},
        {"role": "tool", "content": text, "tool_name": "read_file"},
        {"role": "assistant", "content": json.dumps({"path": path, "diff": diff}), "tool_name": "apply_patch"},
        {"role": "tool", "content": "Patch applied: 1 file changed.", "tool_name": "apply_patch"},
    ]
    if rng.random() < 0.6:
        n = rng.randint(3, 40)
        msgs.append({"role": "assistant", "content": json.dumps({"cmd": f"pytest -q -k {name}"}), "tool_name": "run_command"})
        msgs.append({"role": "tool", "content": f"{'.' * min(n, 20)}\n{n} passed in {rng.randint(1, 90) / 10:.1f}s", "tool_name": "run_command"})
    msgs.append({"role": "assistant", "content": f"I updated `{name}` in {path}; the change is small and the tests pass.", "tool_name": None})
    return msgs
