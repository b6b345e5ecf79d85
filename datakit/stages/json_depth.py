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

import numpy as np

# far below what the parser reaches from any stack datakit calls it on (~950 with Python's default
# recursion limit of 1000), far above any real event (an event nests 3 deep, a tool call's arguments a few more)
MAX_JSON_DEPTH = 512

# a JSON string, its escapes included; one left open runs to the end of the text. Why the open case: a
# pattern that must end at a quote fails at the end of a text cut off inside a string, and the search then
# tries again from every later quote, each `\"` included, scanning to the end each time: quadratic (found
# in review: a 58 KB line cut mid-string took 4.3 s, ~1 h extrapolated at 1 MB, where json.loads refuses it
# in 1 ms). With it every attempt matches, so the scan is linear.
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
# +1 for an opening bracket, -1 for a closing one, 0 for any other byte
_STEP = np.zeros(256, dtype=np.int32)
_STEP[[ord("["), ord("{")]] = 1
_STEP[[ord("]"), ord("}")]] = -1


def json_too_deep(text: str, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON `text` opens more than `limit` arrays/objects inside one another.

    Brackets inside strings do not count (the strings are taken out first, in one regular-expression
    pass). Text that is not valid JSON (an unterminated string, unbalanced brackets) gets some answer;
    the parser refuses it either way. Cheap on ordinary lines: a text with at most `limit` opening
    brackets in all cannot nest deeper, and is not scanned."""
    if text.count("[") + text.count("{") <= limit:
        return False
    bare = _STRING.sub("", text)  # the structure: numbers, literals, brackets, commas and colons
    if bare.count("[") + bare.count("{") <= limit:
        return False
    depth = np.cumsum(_STEP[np.frombuffer(bare.encode("ascii", "replace"), dtype=np.uint8)])
    return bool(depth.max() > limit)
