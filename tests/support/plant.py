"""Planted leaks for tests and benchmarks: the ways an eval item shows up in a training set.

Why Python's own `tokenize` here (and not our lexer): a leak generator that
shared the matcher's tokenizer could hide its bugs. Kinds:

- `exact`: prompt + canonical solution, byte for byte, inside other code.
- `reformatted`: re-spaced by `tokenize.untokenize`, 2-space indentation, extra blank lines.
- `renamed`: every user identifier consistently renamed (strings/docstrings untouched).
- `prompt_only`: the prompt (signature + docstring) without the solution.
- `solution_only`: the solution body without the prompt.
- `comments_changed`: about half of the item's comment lines reworded, new comment lines every few lines.
- `partial`: the signature and the first half of the solution body's lines (a half-written copy).
- `escaped_json`: the item as a JSON line (an eval file checked into a repo): every newline is `\\n`.
- `near_miss`: the same signature and imports with a different body; NOT a leak (must not match).

Every generator takes the item's `prompt` and `solution` texts and works for
any language with `#` or `//` comments (Python, Rust, C-family).
"""
from __future__ import annotations

import builtins
import io
import json
import keyword
import random
import re
import tokenize

LEAK_KINDS = ("exact", "reformatted", "renamed", "prompt_only", "solution_only")
# the kinds of the recall benchmark (issue: "Decontamination a lab trusts"); near_miss must NOT match
BENCH_KINDS = ("exact", "prompt_only", "renamed", "reformatted", "comments_changed", "partial", "escaped_json",
               "near_miss")
_KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls", "typing", "List", "Dict", "Tuple", "Optional", "Any", "math", "re", "collections", "itertools", "hashlib", "sqrt", "floor", "ceil"}
# Rust keywords and standard types: a renamer changes the user's names, never the language's
_KEEP |= set("""fn let mut impl pub use mod struct enum match loop where as ref Self move const static trait type
unsafe crate super dyn usize isize i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 bool char str String Vec Option
Some Ok Err Result Box HashMap HashSet BTreeMap BTreeSet VecDeque std collections cmp max min abs""".split())


def _tokens(code: str) -> list[tokenize.TokenInfo]:
    return list(tokenize.generate_tokens(io.StringIO(code).readline))


def reformat(code: str, rng: random.Random) -> str:
    """Same tokens, different layout: spacing around every token, 2-space indents, blank lines."""
    try:
        out = tokenize.untokenize([(t.type, t.string) for t in _tokens(code)])
    except (tokenize.TokenError, IndentationError, SyntaxError):
        out = re.sub(r"([(),:=+\-*/<>\[\]])", r" \1 ", code)
    lines = []
    for line in out.splitlines():
        stripped = line.lstrip(" ")
        lines.append(" " * ((len(line) - len(stripped)) // 2) + stripped.rstrip())
        if rng.random() < 0.15:
            lines.append("")
    return "\n".join(lines) + "\n"


def rename_identifiers(code: str, rng: random.Random, in_strings: bool = True, attributes: bool = False) -> str:
    """Consistently rename every non-keyword, non-builtin, non-attribute identifier, in strings too.

    Renaming inside strings and docstrings (doctest lines name the function and
    its arguments) is what a rename-and-search/replace does, and it leaves the
    prose as the only literal evidence: the harder case for the matcher.

    C-family code (Rust, ...) is read by Python's tokenizer too, so its `//`
    comments are first made Python comments and treated like docstrings (only
    the code's names renamed in them): read as code, every English word of a
    doc comment would be "renamed", which no refactoring does. A macro call's
    name (`vec!`) is the language's, not the user's: kept.
    """
    c_family = bool(re.search(r"^\s*(?:pub\s+)?fn\s|^\s*//", code, re.M)) and not re.search(r"^\s*def\s", code, re.M)
    if c_family:
        code = re.sub(r"(?m)^([^\n\"]*?)//", lambda m: f"{m.group(1)}#//", code)
    try:
        toks = _tokens(code)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return code.replace("#//", "//") if c_family else code
    mapping: dict[str, str] = {}
    prev = None
    for i, t in enumerate(toks):
        macro = c_family and i + 1 < len(toks) and toks[i + 1].string == "!"
        if t.type == tokenize.NAME and t.string not in _KEEP and not macro and (attributes or not (prev is not None and prev.string == ".")):
            if t.string not in mapping:
                mapping[t.string] = f"{rng.choice(['v', 'tmp', 'x', 'item', 'val'])}_{len(mapping)}_{rng.randrange(100)}"
        if t.type not in (tokenize.NL, tokenize.COMMENT):
            prev = t
    names = re.compile(r"\b(" + "|".join(map(re.escape, sorted(mapping, key=len, reverse=True))) + r")\b") if mapping else None
    out = []
    prev = None
    for t in toks:
        s = t.string
        if t.type == tokenize.NAME and s in mapping and (attributes or not (prev is not None and prev.string == ".")):
            s = mapping[s]
        elif t.type == tokenize.STRING and names is not None and in_strings:
            s = names.sub(lambda m: mapping[m.group(1)], s)
        elif t.type == tokenize.COMMENT and c_family and s.startswith("#//"):
            s = s[1:] if names is None or not in_strings else names.sub(lambda m: mapping[m.group(1)], s[1:])
        out.append((t.type, s))
        if t.type not in (tokenize.NL, tokenize.COMMENT):
            prev = t
    return tokenize.untokenize(out)


def plant(item: dict, kind: str, rng: random.Random, prompt: str = "prompt",
          solution: str = "canonical_solution") -> str:
    """The leaked text of an eval item (a dict with prompt/solution fields) for a leak `kind`."""
    full = item[prompt] + item[solution]
    if kind == "exact":
        return full
    if kind == "reformatted":
        return reformat(full, rng)
    if kind == "renamed":
        return rename_identifiers(full, rng)
    if kind == "prompt_only":
        return item[prompt]
    if kind == "solution_only":
        return item[solution]
    if kind == "comments_changed":
        return change_comments(full, rng)
    if kind == "partial":
        return partial_solution(item[prompt], item[solution])
    if kind == "escaped_json":
        return json.dumps({k: v for k, v in item.items() if isinstance(v, (str, int, list))}, ensure_ascii=False)
    if kind == "near_miss":
        raise ValueError("near_miss needs a body: use near_miss(prompt, solution, other_body)")
    raise ValueError(f"unknown leak kind {kind!r}; known: {LEAK_KINDS}")


_IDIOMS = [
    "for i in range(len({a})):\n    {b} += {a}[i]\n",
    "for i in range(len({a})):\n    for j in range(i + 1, len({a})):\n        if {a}[i] > {a}[j]:\n"
    "            {a}[i], {a}[j] = {a}[j], {a}[i]\n",
    "if __name__ == \"__main__\":\n    main()\n",
    "with open({a}) as f:\n    {b} = json.load(f)\n",
    "def __init__(self, {a}, {b}=None):\n    self.{a} = {a}\n    self.{b} = {b}\n",
    "return [x for x in {a} if x is not None]\n",
    "{b} = {{}}\nfor k, v in {a}.items():\n    {b}[k] = v\n",
    "try:\n    {b} = int({a})\nexcept ValueError:\n    {b} = 0\n",
    "import os\nimport sys\nimport json\nfrom typing import List, Optional\n",
    "{b} = sorted({a}, key=lambda x: x[1], reverse=True)\n",
    "while {a}:\n    {b} = {a}.pop()\n    if not {b}:\n        break\n",
    "if len({a}) == 0:\n    return 0\nreturn sum({a}) / len({a})\n",
    "for idx, elem in enumerate({a}):\n    if elem == {b}:\n        return idx\nreturn -1\n",
    "{b} = [0] * (len({a}) + 1)\nfor i in range(1, len({a}) + 1):\n    {b}[i] = {b}[i - 1] + {a}[i - 1]\n",
    "def {b}(self):\n    return self.{a}\n",
    "parser = argparse.ArgumentParser()\nparser.add_argument(\"--{a}\", type=int, default=0)\nargs = parser.parse_args()\n",
    "result = []\nfor line in {a}.splitlines():\n    line = line.strip()\n    if line:\n        result.append(line)\nreturn result\n",
    "return {a} if {a} > {b} else {b}\n",
    "{b} = {a}[::-1]\nreturn {a} == {b}\n",
    "logger = logging.getLogger(__name__)\n",
]
_NAMES = ["data", "items", "numbers", "values", "arr", "lst", "nums", "text", "s", "xs", "path", "name", "total",
          "count", "result", "out", "res", "acc", "key", "node"]


def idiomatic_code(rng: random.Random, n_idioms: int = 6) -> str:
    """Clean synthetic Python made of very common idioms (loops over range(len(x)), main guards, ...)."""
    parts = ["def f_{}({}):\n".format(rng.randrange(10**6), rng.choice(_NAMES))]
    for _ in range(n_idioms):
        a, b = rng.sample(_NAMES, 2)
        body = rng.choice(_IDIOMS).format(a=a, b=b)
        parts.append("".join("    " + ln + "\n" for ln in body.splitlines()))
    return "".join(parts)


_COMMENT_LINE = re.compile(r"^(\s*)(#|//)(.*)$")
_NEW_COMMENTS = ["handle the edge case first", "TODO: simplify", "main loop", "see the docs", "fast path",
                 "accumulate the result", "this is O(n)", "note: inputs are validated by the caller", "done"]


def change_comments(code: str, rng: random.Random) -> str:
    """Reword about half of the whole-line comments and insert new comment lines every 2-4 lines."""
    marker = "//" if re.search(r"^\s*//", code, re.M) or "fn " in code else "#"
    out: list[str] = []
    next_at = rng.randint(2, 4)
    for i, line in enumerate(code.splitlines()):
        m = _COMMENT_LINE.match(line)
        if m and rng.random() < 0.5:
            line = f"{m.group(1)}{m.group(2)} {rng.choice(_NEW_COMMENTS)}"
        elif i >= next_at and line.strip():
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}{marker} {rng.choice(_NEW_COMMENTS)}")
            next_at = i + rng.randint(2, 4)
        out.append(line)
    return "\n".join(out) + "\n"


def signature(prompt: str, solution: str = "") -> str:
    """The last `def`/`fn` line of the prompt (or of the solution when the prompt has none) and the
    import lines before it: what a different solution to the same task shares with this one."""
    text = prompt if re.search(r"^\s*(?:pub\s+)?(?:async\s+)?(?:def|fn)\s", prompt, re.M) else solution
    lines = text.splitlines()
    sig = [i for i, ln in enumerate(lines) if re.match(r"\s*(?:pub\s+)?(?:async\s+)?(?:def|fn)\s", ln)]
    if not sig:
        return ""
    imports = [ln for ln in lines[: sig[-1]] if re.match(r"\s*(?:from\s+\S+\s+import|import|use)\s", ln)]
    return "\n".join(imports + [lines[sig[-1]]]) + "\n"


def partial_solution(prompt: str, solution: str) -> str:
    """The signature and the first half (by lines, at least one) of the solution's body.

    A solution that starts with its own imports and `def` line (MBPP) keeps them
    as its signature; the half is taken of the lines after them.
    """
    lines = solution.splitlines()
    head = 0
    while head < len(lines) and (not lines[head].strip() or re.match(
            r"\s*(?:from\s+\S+\s+import|import|use|(?:pub\s+)?(?:async\s+)?(?:def|fn))\s", lines[head])):
        head += 1
    body = lines[head:]
    half = body[: max(1, (len(body) + 1) // 2)]
    sig = "\n".join(lines[:head]) + "\n" if head else signature(prompt)
    return sig + "\n".join(half) + "\n"


def near_miss(prompt: str, solution: str, other_body: str) -> str:
    """Same imports and signature, a different (real) body: a different solution to the same task."""
    sig = signature(prompt, solution)
    body = "".join("    " + ln.strip() + "\n" for ln in other_body.splitlines() if ln.strip())
    return sig + body
