"""JSON nesting is judged by the text, never by how deep the parser's caller already is.

Found in review: `json.loads` raises RecursionError at a depth that depends on the stack it is called
from, so the same input line nested ~960 deep was a kept event on the Spark engine and `bad_json` on
the local engine (368 vs 367 events kept; and a tool call's arguments nested ~950 deep were parsed on
one engine and kept as text on the other): the two engines wrote different bytes for one input.
"""
from __future__ import annotations

import json

import pytest

from datakit.stages.extract.rules import _tool_call_text
from datakit.stages.ingest import InvalidEvent, parse_line
from datakit.stages.json_depth import MAX_JSON_DEPTH, json_too_deep

EVENT = {"event_id": "e1", "event_type": "tab_completion", "timestamp": "2026-11-01T12:00:00Z", "user_id": "u1",
         "org_id": "o1", "session_id": "s1", "privacy_mode": False, "file": {"path": "a.py", "language": "python"},
         "context": {"prefix": "def f():\n", "suffix": "\n"}, "suggestion": "    return 1", "outcome": "rejected"}


def _line(depth: int) -> bytes:
    """EVENT with an unknown field nested so that the line nests `depth` deep (the event is level 1)."""
    inner = depth - 1
    return (json.dumps(EVENT)[:-1] + ', "extra": ' + "[" * inner + "]" * inner + "}").encode()


def _outcome(fn, *args):
    try:
        return ("ok", fn(*args))
    except InvalidEvent as e:
        return (e.reason, e.detail)


def _on_a_deeper_stack(frames: int, fn, *args):
    """`fn(*args)` called under `frames` more Python frames (as on another engine or worker)."""
    if frames == 0:
        return fn(*args)
    return _on_a_deeper_stack(frames - 1, fn, *args)


@pytest.mark.parametrize("depth", [3, 400, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 700, 900, 960, 5000])
def test_an_event_line_is_judged_the_same_on_any_stack(depth):
    line = _line(depth)
    shallow = _outcome(parse_line, line)
    deep = _on_a_deeper_stack(300, _outcome, parse_line, line)
    assert shallow == deep
    assert (shallow[0] == "ok") == (depth <= MAX_JSON_DEPTH)
    if depth > MAX_JSON_DEPTH:
        assert shallow == ("bad_json", "nesting too deep")


@pytest.mark.parametrize("depth", [2, 400, MAX_JSON_DEPTH, MAX_JSON_DEPTH + 1, 700, 900, 960])
def test_tool_call_arguments_are_parsed_the_same_on_any_stack(depth):
    content = '{"a": ' * depth + "1" + "}" * depth
    shallow = _tool_call_text("run", content)
    assert _on_a_deeper_stack(300, _tool_call_text, "run", content) == shallow
    parsed = json.loads(shallow)["arguments"]
    assert isinstance(parsed, dict) == (depth <= MAX_JSON_DEPTH)


def test_the_depth_check_reads_strings_as_text():
    assert not json_too_deep('{"a": "' + "[" * 2000 + '"}')  # brackets inside a string do not nest
    assert not json_too_deep('{"a": "\\"' + "{" * 2000 + '\\""}')  # nor after an escaped quote
    assert json_too_deep("[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1))
    assert not json_too_deep("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH)
    assert not json_too_deep("[]" * 5000)  # many brackets side by side are no depth


@pytest.mark.timeout(60)  # a hang guard, not a speed measurement: the old scan took ~1 h on this line
def test_a_line_cut_inside_a_string_is_refused_at_once_not_scanned_quadratically():
    """Found in review: the string pattern had to end at a quote, so on a text cut off inside a string the
    search failed at the end and tried again from every later quote (each `\\"` of escaped code included):
    a 58 KB line took 4.3 s, ~1 h at 1 MB, where json.loads refuses it in a millisecond."""
    code = "".join(f'x[{i}] = {{"k{i}": "v"}}\n' for i in range(40000))  # ~1 MB of code context
    line = json.dumps({"event_id": "e", "event_type": "tab_completion", "context": {"prefix": code, "suffix": ""}})
    with pytest.raises(InvalidEvent) as e:
        parse_line(line[: len(line) // 2].encode())
    assert e.value.reason == "bad_json"
    assert not json_too_deep('"' + '\\"' * 400_000 + "[" * 600)  # all of it one open string


def test_brackets_in_strings_never_count_and_structure_always_does():
    deep = json.loads("[" * 600 + "]" * 600)
    assert json_too_deep(json.dumps({"s": "]" * 600, "d": deep}))  # closing brackets in a string hide nothing
    assert not json_too_deep(json.dumps(["[" * 1000, "{" * 1000]))
    assert not json_too_deep('"' + "[" * 700)  # an open string: its brackets are string text
    assert json_too_deep("[" * 600 + '"abc\\')  # the depth before an open string still counts
    assert json_too_deep("[" * (MAX_JSON_DEPTH + 1)) and not json_too_deep("[" * MAX_JSON_DEPTH)
