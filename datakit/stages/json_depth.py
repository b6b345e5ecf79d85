"""How deep JSON text nests, decided by the text alone, never by the stack it is parsed on.

Why: Python's `json.loads` raises `RecursionError` at a depth that depends on how deep the calling
stack already is (the recursion limit counts the caller's frames too). Found in review: the same
line nested ~960 deep was a kept event on the Spark engine and `bad_json` on the local engine (and a
tool call's arguments nested that deep were parsed on one engine, kept as text on the other), so the
two engines wrote different bytes for the same input. A text nested deeper than `MAX_JSON_DEPTH` is
now refused by this check before any parse, the same on every engine, worker and partitioning.
"""
from __future__ import annotations

import re

# far below what the parser reaches from any stack datakit calls it on (~950 with Python's default
# recursion limit of 1000), far above any real event (an event nests 3 deep, a tool call's arguments a few more)
MAX_JSON_DEPTH = 512

# a JSON string (its escapes included) or one bracket; a string is skipped whole, so brackets inside it
# do not count
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def json_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON `text` opens more than `limit` arrays/objects inside one another.

    Text that is not valid JSON (an unterminated string, unbalanced brackets) gets some answer; the
    parser refuses it either way. Cheap on ordinary lines: a text with at most `limit` opening
    brackets in all cannot nest deeper, and is not scanned."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth = 0
    for m in _TOKEN.finditer(text):
        c = text[m.start()]
        if c == "[" or c == "{":
            depth += 1
            if depth > limit:
                return True
        elif c == "]" or c == "}":
            depth -= 1
    return False
