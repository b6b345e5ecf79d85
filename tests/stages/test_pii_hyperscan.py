"""The hyperscan prefilter path: same findings as the reference on the edges of its Arrow-buffer scan.

Why these cases: hyperscan scans the string column's data buffer as one block,
so a match can run from one row into the next, offsets are bytes (not
characters) in rows with non-ASCII text, and a sliced array starts mid-buffer.
Each would silently shift or lose findings if handled wrong.
"""
from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest

from datakit.stages.scrub_pii.detectors import BY_ENTITY
from datakit.stages.scrub_pii.scan import HS_PREFILTERS, resolve_strategy, scan_batch

pytest.importorskip("hyperscan")

HARD = Path(__file__).resolve().parents[1] / "data" / "pii_hard_cases.jsonl"
CASES = [json.loads(line) for line in HARD.read_text().splitlines() if line.strip()]

SAMPLES = [
    'password = "Tr0ub4dor&3xyz"\nip = "10.20.30.40"',
    "contact jane.doe@example.org or +44 20 7946 0958",
    "IBAN DE89 3704 0044 0532 0130 00 and key sk-ant-api03-" + "a" * 40,
    'token = "ghp_Zx9Kq2Lm4Np6Rs8Tv0Wy1Ab3Cd5Ef7Gh9Ij2K"',
]


def _ref(texts: list[str | None]):
    return scan_batch(texts, strategy="python")


def test_non_ascii_rows_map_byte_offsets_to_characters() -> None:
    texts = ["héllo wörld ✓ — " * 3 + s + " ünïcode" for s in SAMPLES] + ["日本語のテキスト " + SAMPLES[1]]
    got = scan_batch(texts, strategy="hyperscan")
    assert got == _ref(texts)
    assert all(got[i] for i in range(len(texts)))  # every row has findings, at shifted offsets
    for t, fs in zip(texts, got):
        for f in fs:
            assert not t[f.start : f.end].startswith(("é", "ö", "✓", " "))


def test_a_match_split_across_two_rows_is_not_reported_and_hides_nothing() -> None:
    # row 0 ends with the first half of an e-mail, row 1 starts with the rest: no finding in either,
    # but row 1's own e-mail (which ends where the cross-row match ends) must still be found
    texts = ["write to jane.doe", "@example.org", "tail 555-867-5309", "x@example.org"]
    assert scan_batch(texts, strategy="hyperscan") == _ref(texts)


def test_sliced_and_large_string_arrays() -> None:
    texts = ["no pii here"] * 3 + SAMPLES + ["plain"] * 2
    arr = pa.array(texts, pa.string())
    want = _ref(texts[3:7])
    assert scan_batch(arr.slice(3, 4), strategy="hyperscan") == want
    assert scan_batch(pa.array(texts, pa.large_string()).slice(3, 4), strategy="hyperscan") == want
    assert scan_batch(pa.chunked_array([arr.slice(0, 5), arr.slice(5)]), strategy="hyperscan") == _ref(texts)


def test_nulls_and_empty_rows() -> None:
    texts = [None, "", SAMPLES[0], None, ""]
    assert scan_batch(texts, strategy="hyperscan") == _ref(texts)
    assert scan_batch([None, None], strategy="hyperscan") == [[], []]
    assert scan_batch([], strategy="hyperscan") == []


@pytest.mark.parametrize("entity", sorted(HS_PREFILTERS))
def test_engine_specific_prefilters_are_supersets(entity: str) -> None:
    """Every text the detector's own prefilter matches, the hyperscan spelling matches too."""
    det = BY_ENTITY[entity]
    hits = [c["text"] for c in CASES if any(e["entity"] == entity for e in c["expect"])]
    hits += [s for s in SAMPLES if pl.Series([s]).str.contains(det.rust_prefilter)[0]]
    assert hits
    for t in hits:
        for m in pl.Series([t]).str.extract_all(det.rust_prefilter)[0]:
            assert pl.Series([m]).str.contains(HS_PREFILTERS[entity])[0], (entity, len(m))


def test_strategy_names() -> None:
    assert resolve_strategy("auto") == "hyperscan"
    with pytest.raises(ValueError, match="unknown scan strategy"):
        resolve_strategy("grep")  # type: ignore[arg-type]


def test_overlapping_prefilter_matches_of_one_detector() -> None:
    # hyperscan reports every match end (overlaps included), polars only leftmost non-overlapping ones:
    # both must lead to the same validated findings
    texts = ["4111 1111 1111 1111 1111 1111 1111 1", "1.2.3.4.5.6.7.8 and 10.1.2.3", "::1:2:3:4::5"]
    assert scan_batch(texts, strategy="hyperscan") == _ref(texts) == scan_batch(texts, strategy="polars")


def test_null_slot_with_bytes_behind_it_is_not_scanned() -> None:
    # Arrow allows a null string slot to cover bytes of the data buffer; they are not text
    data = b"jane.doe@example.org" + b"bob@example.com"
    offsets = pa.array([0, 20, 35], pa.int32()).buffers()[1]
    validity = pa.array([False, True]).buffers()[1]
    arr = pa.Array.from_buffers(pa.string(), 2, [validity, offsets, pa.py_buffer(data)], null_count=1)
    got = scan_batch(arr, strategy="hyperscan")
    assert got == [[], scan_batch(["bob@example.com"], strategy="python")[0]]
    assert got[1] and got[1][0].entity == "email"


def test_split_literal_gates_ride_along_in_the_single_pass() -> None:
    """The stage hands literals.GATE/GATE_CONT to the hyperscan pass and finds split secrets from their
    match ends: the same as lexing every text whole, and the same as the gates' own polars pass."""
    import inspect
    import textwrap

    from datakit.stages.scrub_pii import literals
    from datakit.stages.scrub_pii.literals import GATE, GATE_CONT, find_split_secrets

    forms = ['t = ("ghp_R7kQ2mX9vL4pN8wZ"\r\n     "c3Tb6Yh1Jd5Fs0Gu2Ae4x1yZ")', 'k = "sk-proj-Qm7Xv2Lp9R\\\nt4Kw8Zb3Nc6Yh1Jd5Fs0Gu2Ae4Hi7Oj"',
             'k = "ghp_R7kQ2mX9vL4pN8wZ" +\n\n   \n  "c3Tb6Yh1Jd5Fs0Gu2Ae4x1yZ"', "é = 'ünï' + 'ghp_R7kQ2mX9vL4pN8wZ' 'c3Tb6Yh1Jd5Fs0Gu2Ae4x1yZ'"]
    texts = [c["text"] for c in CASES] + [inspect.getsource(m) for m in (textwrap, literals)] + forms + [None, ""]
    ends: list[dict[int, list[int]]] = []
    found = scan_batch(texts, strategy="hyperscan", gates=(GATE, GATE_CONT), gate_ends=ends)
    assert found == _ref(texts)  # the gates change no detector finding
    assert len(ends) == 2 and ends[0] and ends[1]
    want = find_split_secrets(texts, gated=False)
    assert len(want) >= 10
    assert find_split_secrets(texts, gate_ends=(ends[0], ends[1])) == want == find_split_secrets(texts)
    assert find_split_secrets(pa.array(texts, pa.string()), gate_ends=(ends[0], ends[1])) == want
    # under the other strategies the caller's list stays empty (it runs its own gate pass)
    other: list[dict[int, list[int]]] = []
    scan_batch(texts, strategy="polars", gates=(GATE,), gate_ends=other)
    assert other == []


# ---------------------------------------------------------------- found in review

def test_no_line_detector_left_is_not_a_hyperscan_error() -> None:
    """`entities: [private_key]`: the token-line recheck has no line detectors (hyperscan refuses 0 patterns)."""
    from datakit.stages.scrub_pii.stage import ScrubPiiConfig

    assert scan_batch(["x", None], (), strategy="hyperscan") == [[], []]
    pem = "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEAu1SU1LfVLPHCozMxH2Mo4lgOEePzNm0tRgeLezV6ffAt0gun\n-----END RSA PRIVATE KEY-----"
    fn = ScrubPiiConfig(ner="off", entities=["private_key"], strategy="hyperscan").build_fn()
    assert fn.scrub(["x" + pem + "x", "plain"])[0] == ["x<PRIVATE_KEY>x", "plain"]


def test_string_view_and_dictionary_columns() -> None:
    texts = SAMPLES + [None]
    want = _ref(texts)
    for typ in (pa.string_view(), pa.dictionary(pa.int32(), pa.string())):
        arr = pa.array(texts, pa.string()).cast(typ)
        for strategy in ("hyperscan", "polars"):
            assert scan_batch(arr, strategy=strategy) == want, (typ, strategy)


def test_hyperscan_spellings_checked_with_hyperscan() -> None:
    """Each HS_PREFILTERS spelling, compiled by hyperscan itself, matches where the Rust prefilter matches."""
    import hyperscan

    for entity, spelling in HS_PREFILTERS.items():
        det = BY_ENTITY[entity]
        texts = [c["text"] for c in CASES if any(e["entity"] == entity for e in c["expect"])]
        assert texts, entity
        db = hyperscan.Database(mode=hyperscan.HS_MODE_BLOCK)
        db.compile(expressions=[spelling.encode()], ids=[0], elements=1, flags=[0])
        for t in texts:
            data = t.encode()
            ends: list[int] = []
            db.scan(data, match_event_handler=lambda _i, _a, end, _f, _c: ends.append(end))
            for m in pl.Series([t]).str.extract_all(det.rust_prefilter)[0]:
                # the end of the Rust prefilter's match (in bytes) lies on a line hyperscan reports
                at = t.find(m)
                line = t.count("\n", 0, at)
                assert any(data.count(b"\n", 0, e - 1) == line for e in ends), (entity, line)
