"""The run report's profile counters (datakit/quality/profile.py) equal a plain per-row count.

The counters are computed per group code with numpy; the reference here is the obvious loop over
rows (one "kind|language" string per row, as the profile was first written), on batches with the
awkward values: nulls, empty strings, a "|" inside a value, values that clean to one name (cut at 40
characters), zero-token documents, preference pairs, nested `source.language`.
"""
from __future__ import annotations

import json
import random
from collections import Counter

import numpy as np
import pyarrow as pa
import pytest

from datakit.plan import METRICS
from datakit.quality.columns import column
from datakit.quality.profile import PREFIX, ProfileFn, _buckets, _clean

KINDS = ["code", "chat", None, "", "a|b", "x" * 45, "x" * 41]
LANGS = ["python", "rust", None, "", "c|pp", "y" * 40 + "1", "y" * 40 + "2"]


def _reference(batch: pa.RecordBatch, lengths: bool) -> dict[str, int]:
    names = batch.schema.names
    kinds = batch.column("kind").to_pylist() if "kind" in names else [None] * batch.num_rows
    if "language" in names:
        langs = batch.column("language").to_pylist()
    elif "source" in names:
        langs = [None if s is None else s.get("language") for s in batch.column("source").to_pylist()]
    else:
        langs = [None] * batch.num_rows
    groups = [f"{_clean(k)}|{_clean(lang)}" for k, lang in zip(kinds, langs)]
    c: Counter = Counter(f"{PREFIX}docs|{g}" for g in groups)
    if lengths and "n_tokens" in names:
        toks = batch.column("n_tokens").to_pylist()
        for extra in ("prompt_ids", "chosen_ids", "rejected_ids"):
            if extra in names:
                toks = [t + len(v or []) for t, v in zip(toks, batch.column(extra).to_pylist())]
        for g, t, b in zip(groups, toks, _buckets(np.array(toks)).tolist()):
            c[f"{PREFIX}tokens|{g}|{b}"] += 1
            c[f"{PREFIX}token_sum|{g}"] += t
    elif lengths and "segments" in names:
        chars = column(batch, "text_chars").to_numpy(zero_copy_only=False)
        for g, b in zip(groups, _buckets(chars).tolist()):
            c[f"{PREFIX}chars|{g}|{b}"] += 1
    return dict(c)


def _profiled(batch: pa.RecordBatch, lengths: bool) -> dict[str, int]:
    out = ProfileFn(lengths)(batch)
    assert out.schema.names == batch.schema.names + [METRICS]
    assert out.select(batch.schema.names).equals(batch)  # a pass-through
    values = [v for v in out.column(METRICS).to_pylist() if v is not None]
    assert len(values) == 1
    return json.loads(values[0])


def _tokenized(rng: random.Random, n: int, preference: bool = False) -> pa.RecordBatch:
    cols = {"kind": pa.array([rng.choice(KINDS) for _ in range(n)], pa.string()),
            "language": pa.array([rng.choice(LANGS) for _ in range(n)], pa.string()),
            "n_tokens": pa.array([rng.choice([0, 1, 2, 3, 700, 2**20 + 5]) for _ in range(n)], pa.int64())}
    if preference:
        cols["prompt_ids"] = pa.array([None if rng.random() < 0.2 else [1] * rng.randrange(9) for _ in range(n)],
                                      pa.list_(pa.int32()))
    return pa.RecordBatch.from_pydict(cols)


@pytest.mark.parametrize("preference", [False, True])
def test_token_counters_equal_a_per_row_count(preference):
    rng = random.Random(7)
    for n in (1, 5, 300):
        batch = _tokenized(rng, n, preference)
        for lengths in (False, True):
            got, want = _profiled(batch, lengths), _reference(batch, lengths)
            assert got == want
    # a group whose documents hold no tokens still has its (zero) token sum
    zero = pa.RecordBatch.from_pydict({"kind": ["code"], "language": ["go"], "n_tokens": pa.array([0], pa.int64())})
    assert _profiled(zero, True)[f"{PREFIX}token_sum|code|go"] == 0


def test_record_counters_equal_a_per_row_count_with_nested_language():
    rng = random.Random(3)
    n = 200
    seg = pa.struct([("role", pa.string()), ("text", pa.string())])
    batch = pa.RecordBatch.from_pydict({
        "kind": pa.array([rng.choice(KINDS) for _ in range(n)], pa.string()),
        "source": pa.array([None if rng.random() < 0.1 else {"language": rng.choice(LANGS)} for _ in range(n)],
                           pa.struct([("language", pa.string())])),
        "segments": pa.array([[{"role": "code", "text": "z" * rng.choice([0, 1, 5, 5000])}] * rng.randrange(3)
                              for _ in range(n)], pa.list_(seg)),
    })
    for lengths in (False, True):
        assert _profiled(batch, lengths) == _reference(batch, lengths)
    assert sum(v for k, v in _profiled(batch, False).items()) == n


def test_a_batch_without_kind_or_language_counts_as_unknown():
    batch = pa.RecordBatch.from_pydict({"kind": pa.array([None, None], pa.string()), "n_tokens": [4, 9]})
    assert _profiled(batch, True) == {f"{PREFIX}docs|unknown|unknown": 2, f"{PREFIX}tokens|unknown|unknown|3": 1,
                                      f"{PREFIX}tokens|unknown|unknown|4": 1, f"{PREFIX}token_sum|unknown|unknown": 13}


def test_a_long_tail_of_languages_is_folded_into_other_and_labels_have_no_control_characters():
    """Found in review: 3,000 distinct `file.language` values made `_run.json` 1.8 MB and the report 23 MB
    (142 s drawing legends), and a NUL byte in a language reached stderr through matplotlib."""
    from datakit.quality.profile import MAX_LANGUAGES, fold

    metrics = {f"{PREFIX}docs|code|lang{i:04d}": 1 + (i < 5) for i in range(3000)}
    metrics.update({f"{PREFIX}chars|code|lang{i:04d}|3": 2 for i in range(3000)})
    metrics[f"{PREFIX}docs|sft|python"] = 500
    metrics["pii.email"] = 7
    own, prof = fold(metrics)
    assert own == {"pii.email": 7}
    langs = {g.split("|", 1)[1] for g in prof["docs"]}
    assert len(langs) == MAX_LANGUAGES and "other" in langs and {"python", "lang0000", "lang0004"} <= langs
    # nothing is lost: the folded counts sum to the same totals
    assert sum(prof["docs"].values()) == sum(v for k, v in metrics.items() if k.startswith(f"{PREFIX}docs|"))
    assert sum(sum(b.values()) for b in prof["chars"].values()) == 6000
    assert prof["chars"]["code|other"]["3"] == 2 * (3000 - (MAX_LANGUAGES - 2))
    assert _clean("py\x00thon") == "unlisted" and _clean("a|b") == "unlisted"


def test_a_language_label_that_could_be_personal_data_is_not_named():
    """Found in review: `file.language` is free text from the editor, and the extract stage's profile (before
    scrub_pii) put an e-mail address and an AWS key sent there into `_run.json` and `--json` output. A label
    is named only when it has a language name's shape."""
    named = ["python", "typescriptreact", "restructuredtext", "objective-c++", "c#", "visual basic .net", "f#", "x86-64"]
    assert [_clean(v) for v in named] == named
    hidden = ["jane.doe@example.com", "AKIAQWERTYUIOPASDFGH", "+1 415 867 5309", "ghp_5MQ34CCYabcdefghijklmnop",
              "https://x.org/a", "<EMAIL>", "a" * 41, "py\x00thon", "line\nbreak"]
    assert {_clean(v) for v in hidden} == {"unlisted"}
    assert _clean(None) == _clean("") == "unknown"
