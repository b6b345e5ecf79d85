"""Secrets split across adjacent string literals: joined, found, replaced by one span, code kept valid."""
from __future__ import annotations

import ast
import inspect
import json
import re
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.scrub_pii.detectors import BY_ENTITY
from datakit.stages.scrub_pii.literals import GATE, GATE_CONT, find_split_secrets, scan_text_split
from datakit.stages.scrub_pii.replace import Replacer
from datakit.stages.scrub_pii.scan import scan_text
from datakit.stages.scrub_pii.stage import ScrubFn, ScrubPiiConfig

HARD = Path(__file__).resolve().parents[1] / "data" / "pii_hard_cases.jsonl"
ALL_CASES = [json.loads(line) for line in HARD.read_text().splitlines() if line.strip()]
# the split-literal hard cases: `expect` is what the line scanner alone finds (what
# test_pii_detectors and the presidio bridge test check), `expect_stage` what the stage finds
SPLIT = [c for c in ALL_CASES if "expect_stage" in c]
SPLIT_POS = [c for c in SPLIT if c["expect_stage"]]
SPLIT_NEG = [c for c in SPLIT if not c["expect_stage"]]

FN = ScrubPiiConfig(ner="off").build_fn()
PSEUDO = ScrubFn(FN.detectors, Replacer({e: "pseudonym" for e in ScrubPiiConfig(ner="off").policies()}, key=b"k"))

GITHUB = "ghp_R7kQ2mX9vL4pN8wZc3Tb6Yh1Jd5Fs0Gu2Ae4"  # fake, 36 characters after the prefix


def _stage(text: str) -> list[tuple[str, str]]:
    return [(f.entity, text[f.start : f.end]) for f in FN.scan([text])[0]]


def _scrub(text: str, fn: ScrubFn = FN) -> str:
    return fn.scrub([text])[0][0]  # type: ignore[return-value]


def test_hard_cases_cover_every_form() -> None:
    ids = {c["id"] for c in SPLIT}
    assert len(SPLIT_POS) >= 8 and len(SPLIT_NEG) >= 3
    for form in ("py_paren", "plus", "backslash", "c_adjacent", "php_dot", "lua_dotdot", "literal_continuation"):
        assert any(form in i for i in ids), form


@pytest.mark.parametrize("case", SPLIT, ids=[c["id"] for c in SPLIT])
def test_split_hard_case(case: dict) -> None:
    text = case["text"]
    assert sorted(_stage(text)) == sorted((e["entity"], e["value"]) for e in case["expect_stage"])
    # the line scanner alone finds exactly `expect` (so the split finding is new, not a re-count)
    assert sorted((f.entity, text[f.start : f.end]) for f in scan_text(text)) == sorted(
        (e["entity"], e["value"]) for e in case["expect"])


@pytest.mark.parametrize("case", SPLIT_POS, ids=[c["id"] for c in SPLIT_POS])
def test_split_secret_is_one_span_from_first_to_last_fragment(case: dict) -> None:
    text = case["text"]
    (f,) = FN.scan([text])[0]
    span = text[f.start : f.end]
    # the span crosses a split (a closing quote, or a backslash-newline inside one literal) ...
    assert any(q in span for q in "\"'`") or "\\\n" in span
    # ... and replacing it leaves no piece of the joined secret outside the placeholder
    out = _scrub(text)
    assert out.count(BY_ENTITY[f.entity].placeholder) == 1
    pieces = [p for p in re.split(r"[\"'`]|\\\r?\n", span) if len(p.strip(" \t\n+.\\@$")) >= 4]
    assert len(pieces) >= 2
    for piece in pieces:
        assert piece not in out, case["id"]


PY_FORMS = {
    "implicit, parenthesized": 'token = ("{a}"\n         "{b}")\n',
    "implicit, same line": 'token = "{a}" "{b}"\n',
    "plus": 'token = "{a}" + "{b}"\n',
    "plus, line break in parens": 'token = ("{a}" +\n         "{b}")\n',
    "backslash continuation": 'token = "{a}" \\\n    "{b}"\n',
    "continuation inside the literal": 'token = "{a}\\\n{b}"\n',
    "call argument": 'client = Github(login_or_token="{a}"\n                "{b}", timeout=3)\n',
    "three fragments": 'token = ("{a}"\n         "{b}"\n         "")\n',
}


@pytest.mark.parametrize("form", sorted(PY_FORMS))
@pytest.mark.parametrize("cut", [4, 11, 30])
def test_python_forms_scrub_to_valid_code(form: str, cut: int) -> None:
    text = PY_FORMS[form].format(a=GITHUB[:cut], b=GITHUB[cut:])
    ast.parse(text)
    assert [e for e, _ in _stage(text)] == ["github_token"]
    out = _scrub(text)
    tree = ast.parse(out)  # the placeholder replaced one span: still valid code ...
    assert GITHUB[:cut] not in out and GITHUB[cut:] not in out
    # ... where the joined literals became one string constant holding the placeholder
    consts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    assert [c for c in consts if "<GITHUB_TOKEN>" in c] == ["<GITHUB_TOKEN>"]


def test_issue_example_becomes_one_placeholder_literal() -> None:
    text = 'token = ("ghp_ABCDEFGHIJKLMNOPQR"\n         "STUVWXYZ0123456789ab")'
    assert _scrub(text) == 'token = ("<GITHUB_TOKEN>")'
    assert ast.parse(_scrub(text))


@pytest.mark.parametrize("text,entity", [
    ('const key = "sk-proj-Qm7Xv2Lp9Rt4Kw8Z" +\n  "b3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj";', "openai_key"),  # JS/TS
    ('String k = "AKIA2E0A" +\n    "8QYZLJ4XN7PD";', "aws_access_key"),  # Java
    ('var k = "xoxp-2716408234-" + "4839201733-kT9bQ2mX7vL4";', "slack_token"),  # C#
    ('var k = $@"glpat-xK3mN9pQ" + @"2rT5vW8yZ1aB";', "gitlab_token"),  # C# prefixes
    ('k := "AIzaSyA1b2C3d4E5f6G7" +\n\t"h8I9j0K1l2M3n4O5p6Q"', "google_api_key"),  # Go
    ('const char *k = "sk_live_4eC39HqLy"\n                "jWDarjtT1zdp7dc";', "stripe_key"),  # C adjacent
    ('#define KEY L"AKIA2E0A" L"8QYZLJ4XN7PD"', "aws_access_key"),  # C wide literals
    ("$k = 'xoxb-2716408234-' . '4839201733-kT9bQ2mX7vL4';", "slack_token"),  # PHP
    ('local k = "sk-ant-api03-Xy7Kq2Lm4Np6Rs8T" .. "v0Wy1Ab3Cd5Ef7Gh9Ij2KqZ"', "anthropic_key"),  # Lua
    ("k = `ghp_R7kQ2mX9vL4pN8wZ` + `c3Tb6Yh1Jd5Fs0Gu2Ae4`;", "github_token"),  # JS template literals
    ('jwt = ("eyJhbGciOiJIUzI1NiJ9."\n       "eyJzdWIiOiIxMjM0In0."\n       "dBjftJeZ4CVPmB92K27uhbUJU1p1r")', "jwt"),
])
def test_other_languages(text: str, entity: str) -> None:
    found = _stage(text)
    assert [e for e, _ in found] == [entity]
    out = _scrub(text)
    assert BY_ENTITY[entity].placeholder in out
    assert out.count(BY_ENTITY[entity].placeholder) == 1


@pytest.mark.parametrize("text", [
    'greeting = "Hello, " + name + "!"',
    'x = "a" "b"',
    'msg = f"{user}: " f"{count} items"',
    'label = f"run-{run_id}-" f"step-{step}"',
    'query = ("SELECT id, name "\n         "FROM users "\n         "WHERE id = %s")',
    'items = ["abc",\n         "def"]',
    # commas, names and calls are not glue, even between token-shaped fragments
    'PREFIXES = ["ghp_R7kQ2mX9vL4pN8wZ",\n            "c3Tb6Yh1Jd5Fs0Gu2Ae4"]',
    'k = "ghp_R7kQ2mX9vL4pN8wZ" + sep + "c3Tb6Yh1Jd5Fs0Gu2Ae4"',
    'k = f("ghp_R7kQ2mX9vL4pN8wZ") + "c3Tb6Yh1Jd5Fs0Gu2Ae4"',
    'k = "ghp_R7kQ2mX9vL4pN8wZ" # "c3Tb6Yh1Jd5Fs0Gu2Ae4"',
    # a split at a space is prose, not a key
    'raise ValueError("a token must start with "\n                 "ghp_ or gho_")',
    # a split UUID / git SHA / alphabet are still not secrets once joined
    'request_id = ("0adaf92d-2534-d858-"\n              "b1e8-9782e23d2e90")',
    'value = ("3f9a0c1d2e4b5a6978"\n         "8d7c6b5a4f3e2d1c0b9a")',
    "set_d = ('ABCDEFGHIJKLMNOPQRSTUVWXYZ'\n         'abcdefghijklmnopqrstuvwxyz'\n         '0123456789')",
    # a docstring's quotes are not adjacent literals
    'def f():\n    """ghp_R7kQ2mX9vL4pN8wZ"""\n    "c3Tb6Yh1Jd5Fs0Gu2Ae4"',
])
def test_ordinary_concatenations_are_not_secrets(text: str) -> None:
    assert find_split_secrets([text]) == {}
    assert find_split_secrets([text], gated=False) == {}
    # the stage finds what the line scanner finds in single literals (a 20-char fragment may be a
    # high-entropy value on its own), nothing joined
    assert _stage(text) == [(f.entity, text[f.start : f.end]) for f in scan_text(text)]


def test_assignment_value_joined_only_when_it_is_one_value() -> None:
    # parenthesized: one value, the whole password is replaced (the line scanner sees nothing)
    text = 'DB_PASSWORD = ("Tr0ub4dor"\n               "&3xyzQ!")'
    assert scan_text(text) == []
    assert _scrub(text) == 'DB_PASSWORD = ("<SECRET>")'
    # same line: the line scanner already replaces the first fragment; the joined value replaces all
    text = 'password = "Tr0ub4dor" "&3xyzQ!"'
    assert [f.entity for f in scan_text(text)] == ["secret_assignment"]
    assert _scrub(text) == 'password = "<SECRET>"'
    # a bare line break without a parenthesis ends a Python statement: not one value
    text = 'password = "Tr0ub4dor&3x"\n"unrelated line"'
    assert find_split_secrets([text]) == {}
    assert _scrub(text) == 'password = "<SECRET>"\n"unrelated line"'


def test_split_token_beats_generic_findings_on_its_fragments() -> None:
    text = 'api_key = "sk-proj-Qm7Xv2Lp9Rt4Kw8Z" + "b3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj"'
    assert [f.entity for f in scan_text(text)] == ["secret_assignment"]  # the first fragment only
    assert [e for e, _ in _stage(text)] == ["openai_key"]
    assert _scrub(text) == 'api_key = "<API_KEY>"'


def test_nothing_is_counted_twice() -> None:
    # the whole token inside one literal of a run: the line scanner's finding, not the split path's
    text = 'connect("prefix-" "' + GITHUB + '")'
    assert find_split_secrets([text]) == {}
    assert [e for e, _ in _stage(text)] == ["github_token"]
    # a complete token followed by more token characters in the next literal: both paths see it,
    # one finding survives (the longer, joined one), counted once
    text = 'Github("' + GITHUB + '"\n       "Zq9")'
    assert [e for _, _, _, e in find_split_secrets([text])[0]] == ["github_token"]
    assert [e for e, _ in _stage(text)] == ["github_token"]
    assert _scrub(text) == 'Github("<GITHUB_TOKEN>")'
    # a single literal is never the split path's
    assert find_split_secrets([f'k = "{GITHUB}"', f'k = ("{GITHUB}")'], gated=False) == {}


def test_known_limits_are_not_joined() -> None:
    """Documented limits (docs/pii.md): if one of these starts to be joined, update the docs."""
    # mixed quotes: one placeholder span from `"` to `'` would leave unbalanced quotes
    assert find_split_secrets(["""k = ("ghp_R7kQ2mX9vL4pN8wZ" 'c3Tb6Yh1Jd5Fs0Gu2Ae4')"""], gated=False) == {}
    # no glue character at all (legal in Python and C, but unusual; keeps `"""` out of the gate)
    assert find_split_secrets(['k = "ghp_R7kQ2mX9vL4pN8wZ""c3Tb6Yh1Jd5Fs0Gu2Ae4"'], gated=False) == {}
    # a comment between the literals
    assert find_split_secrets(['k = ("ghp_R7kQ2mX9vL4pN8wZ"  # part 1\n     "c3Tb6Yh1Jd5Fs0Gu2Ae4")'],
                              gated=False) == {}


def test_gated_path_equals_lexing_everything() -> None:
    import datakit.stages.scrub_pii.scan as scan_mod
    import textwrap

    texts = [c["text"] for c in ALL_CASES] + [inspect.getsource(m) for m in (textwrap, scan_mod, ast, json)]
    texts += ["\n".join(c["text"] for c in SPLIT), None, "", "no quotes at all"]
    texts += [PY_FORMS[f].format(a=GITHUB[:9], b=GITHUB[9:]) for f in sorted(PY_FORMS)]
    gated = find_split_secrets(texts)
    assert gated == find_split_secrets(texts, gated=False)
    assert len(gated) >= len(SPLIT_POS)
    # an Arrow column gives the same as a list
    assert find_split_secrets(pa.array(texts, pa.string())) == gated


def test_gate_is_a_rust_regex_that_matches_every_split_case() -> None:
    import polars as pl

    s = pl.Series([c["text"] for c in SPLIT_POS])
    assert (s.str.contains(GATE) | s.str.contains(GATE_CONT)).all()
    assert s.str.contains(GATE).sum() == len(SPLIT_POS) - 1  # all but the continuation inside one literal


def test_stage_fn_on_a_record_batch() -> None:
    a, b = GITHUB[:18], GITHUB[18:]
    recs = [
        {"doc_id": "code", "kind": "code", "segments": [
            {"text": f'token = ("{a}"\n         "{b}")\nprint(token)\n', "train": True, "role": "code"}],
         "chosen": None, "rejected": None, "source": None, "meta": "{}"},
        # FIM: the run is cut by the split (prefix | middle): found when read in document order
        {"doc_id": "fim", "kind": "fim", "segments": [
            {"text": f'"{b}")\n', "train": True, "role": "middle"},
            {"text": f'token = ("{a}"\n         ', "train": False, "role": "prefix"},
            {"text": "print(token)\n", "train": False, "role": "suffix"}],
         "chosen": None, "rejected": None, "source": None, "meta": "{}"},
        {"doc_id": "pref", "kind": "preference",
         "segments": [{"text": "set the key", "train": False, "role": "prompt"}],
         "chosen": 'KEY = "sk-proj-Qm7Xv2Lp9Rt4Kw8Z" + "b3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj"', "rejected": "no",
         "source": None, "meta": "{}"},
        {"doc_id": "clean", "kind": "code", "segments": [
            {"text": 'msg = ("Hello, "\n       "world")\n', "train": True, "role": "code"}],
         "chosen": None, "rejected": None, "source": None, "meta": "{}"},
    ]
    out = FN(pa.RecordBatch.from_pylist(recs, schema=TRAINING_RECORD_V1)).to_pylist()
    blob = json.dumps(out)
    for frag in (a, b, "Qm7Xv2Lp9Rt4Kw8Z", "b3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj"):
        assert frag not in blob
    assert out[0]["segments"][0]["text"] == 'token = ("<GITHUB_TOKEN>")\nprint(token)\n'
    ast.parse(out[0]["segments"][0]["text"])
    fim = {s["role"]: s["text"] for s in out[1]["segments"]}
    assert fim["prefix"] + fim["middle"] + fim["suffix"] == 'token = ("<GITHUB_TOKEN>")\nprint(token)\n'
    assert out[2]["chosen"] == 'KEY = "<API_KEY>"'
    assert out[3]["segments"][0]["text"] == 'msg = ("Hello, "\n       "world")\n'
    metrics = [json.loads(r["_metrics"]) for r in out if r["_metrics"]]
    assert metrics == [{"pii.github_token": 2, "pii.openai_key": 1}]


# ---------------------------------------------------------------- properties

TOKENS = [GITHUB, "sk-proj-Qm7Xv2Lp9Rt4Kw8Zb3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj", "AKIA2E0A8QYZLJ4XN7PD",
          "xoxb-2716408234-4839201733-kT9bQ2mX7vL4", "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
          "glpat-xK3mN9pQ2rT5vW8yZ1aB", "sk_live_4eC39HqLyjWDarjtT1zdp7dc"]
GLUES = [" ", "\n    ", " + ", " +\n    ", " \\\n    ", "\\\n"]


@st.composite
def split_python(draw) -> tuple[str, str]:
    """`name = (<token cut into 2-4 literals with random glue>)` and the token."""
    tok = draw(st.sampled_from(TOKENS))
    cuts = sorted(draw(st.sets(st.integers(1, len(tok) - 1), min_size=1, max_size=3)))
    parts = [tok[i:j] for i, j in zip([0] + cuts, cuts + [len(tok)])]
    glue = [draw(st.sampled_from(GLUES)) for _ in parts[1:]]
    q = draw(st.sampled_from(['"', "'"]))
    body = q + parts[0] + q + "".join(g + q + p + q for g, p in zip(glue, parts[1:]))
    return f"value = ({body})\n", tok


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_python())
def test_any_cut_of_a_token_is_found_and_scrubs_to_valid_python(case: tuple[str, str]) -> None:
    text, tok = case
    ast.parse(text)
    (found,) = FN.scan([text])[0]
    q = text[len("value = (")]
    out = _scrub(text)
    assert out == f"value = ({q}{BY_ENTITY[found.entity].placeholder}{q})\n"
    ast.parse(out)
    assert find_split_secrets([text]) == find_split_secrets([text], gated=False)


FRAGMENTS = ([c["text"] for c in SPLIT] + TOKENS + [t[:9] for t in TOKENS] + [t[9:] for t in TOKENS]
             + ['"', "'", "`", " + ", " . ", " .. ", "\\\n", "\n", " ", "(", ")", ",", "password = ", "token = (",
                "<SECRET>", "<GITHUB_TOKEN>", "@", "://", "a:b", "f", "b",
                # values that hold a quote: replacing them re-pairs the quotes after them (found in review)
                "# Author: Pat O'Brien ", "# Copyright 2020 Pat O'Brien, key=", "https://u:p`w@h.io "])
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(alphabet="abXY09_-+.\"' \n\\", max_size=12)),
                 max_size=10).map("".join)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
# found by hypothesis: the replaced OpenAI key joined lines 1-2, so the stray `'` on line 1 closed
# on line 2 and the GitHub run on lines 2-3 lexed only after the first scrub (settle_line_merges)
@example('\'api_key = "sk-proj-Qm7Xv2Lp9Rt4Kw8Z" + "b3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj"\n"0\'token = ("ghp_R7kQ2mX9vL4pN8wZ"\n'
         '         "c3Tb6Yh1Jd5Fs0Gu2Ae4")\n')
def test_scrub_with_split_literals_is_idempotent_and_never_adds_detections(text: str) -> None:
    for fn in (FN, PSEUDO):
        once = _scrub(text, fn)
        assert _scrub(once, fn) == once
        assert len(fn.scan([once])[0]) <= len(fn.scan([text])[0])
    assert find_split_secrets([text]) == find_split_secrets([text], gated=False)
    for a, b, _p, _e in scan_text_split(text):
        assert a < b


def test_candidate_rows_from_a_scanners_own_pass() -> None:
    """A scanner that already ran ROW_GATE/GATE_CONT may hand over its rows: same findings, no first pass."""
    import polars as pl

    from datakit.stages.scrub_pii.literals import ROW_GATE

    texts = [c["text"] for c in ALL_CASES] + [None, "plain"]
    s = pl.Series(texts, dtype=pl.String)
    rows = (s.str.contains(ROW_GATE) | s.str.contains(GATE_CONT)).fill_null(False).arg_true().to_list()
    assert len(rows) < len(texts)
    assert find_split_secrets(texts, candidate_rows=rows) == find_split_secrets(texts)
    assert find_split_secrets(texts, candidate_rows=range(len(texts))) == find_split_secrets(texts)
    assert find_split_secrets(texts, candidate_rows=[]) == {}


def test_scan_takes_lists_arrow_arrays_and_chunked_arrays_alike() -> None:
    texts = [c["text"] for c in SPLIT] + [None]
    want = FN.scan(texts)
    assert sum(map(len, want)) >= len(SPLIT_POS)
    assert FN.scan(pa.array(texts, pa.string())) == want
    assert FN.scan(pa.chunked_array([texts[:5], texts[5:]], pa.string())) == want


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(texts)
@example('\'api_key = "sk-proj-Qm7Xv2Lp9Rt4Kw8Z" + "b3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj"\n"0\'token = ("ghp_R7kQ2mX9vL4pN8wZ"\n'
         '         "c3Tb6Yh1Jd5Fs0Gu2Ae4")\n')
def test_settling_line_merges_around_the_joined_lines_equals_rescanning_everything(text: str) -> None:
    """`settle_line_merges` rescans only the runs around lines a replacement joined: same as the whole text."""
    from datakit.stages.scrub_pii.literals import merge_findings, settle_line_merges

    priority = {d.entity: d.priority for d in FN.detectors}
    from datakit.stages.scrub_pii.scan import scan_batch

    base = scan_batch([text], FN.detectors, "python")
    split = find_split_secrets([text], FN.detectors, gated=False)
    if split:
        base = merge_findings(base, split, priority)
    results = []
    for whole in (False, True):
        found = list(base)
        settle_line_merges({0: text}, found, FN.detectors, priority, FN.replacer.token, None, whole_text=whole)
        results.append(found)
    assert results[0] == results[1]


# ---------------------------------------------------------------- found in review

@pytest.mark.parametrize("strategy", ["python", "polars", "hyperscan"])
def test_a_quote_inside_a_replaced_value_does_not_hide_a_split_secret(strategy: str) -> None:
    """`O'Brien` (a person) or a backtick in URL credentials re-pairs the quotes after it once replaced."""
    a, b = GITHUB[:20], GITHUB[20:]
    fn = ScrubPiiConfig(ner="off", strategy=strategy).build_fn()
    for text, want in (
        (f"# Author: Pat O'Brien '{a}' '{b}'", "# Author: <PERSON> '<GITHUB_TOKEN>'"),
        (f"# Copyright 2020 Pat O'Brien, key='{a}' '{b}'", "# Copyright 2020 <PERSON>, key='<GITHUB_TOKEN>'"),
        (f"echo https://u:p`w@h.io `{a}` `{b}`", "echo https://<CREDENTIALS>@h.io `<GITHUB_TOKEN>`"),
    ):
        once = fn.scrub([text])[0][0]
        assert once == want
        assert fn.scrub([once])[0][0] == once


def test_windows_of_a_minified_line_grow_once() -> None:
    """Thousands of gate hits on one long line: same windows as growing each, without re-growing each."""
    from datakit.stages.scrub_pii.literals import _grow, _windows_at

    line = 'x="ab"+"cd";' * 2000 + "\n" + 'k = ("ghp_R7kQ2mX9vL4pN8wZ"\n  "c3Tb6Yh1Jd5Fs0Gu2Ae4x1yZ")\n'
    ends = [m.end() for m in re.finditer(r'"\+"c|"\n  "c', line)]
    got = _windows_at(line, ends, [])
    every: list[tuple[int, int]] = []
    for a, b in sorted(_grow(line, line.rfind("\n", 0, e - 1) + 1, e) for e in ends):
        if every and a <= every[-1][1]:
            every[-1] = (every[-1][0], max(every[-1][1], b))
        else:
            every.append((a, b))
    assert got == every and len(got) == 2
    assert find_split_secrets([line], gated=True) == find_split_secrets([line], gated=False) != {}
