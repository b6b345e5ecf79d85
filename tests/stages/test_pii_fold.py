"""Values hidden behind invisible or fullwidth characters are scrubbed (`scrub_pii/fold.py`).

Found in review: a zero-width space inside an e-mail or key, or a fullwidth `＠`, defeated every
detector, while the text still holds the value for a model to learn."""
from __future__ import annotations

import pyarrow as pa
import pytest

from datakit.stages.scrub_pii import scan_batch, scan_text
from datakit.stages.scrub_pii.fold import fold_text, fold_view, folded_rows
from datakit.stages.scrub_pii.replace import Replacer
from datakit.stages.scrub_pii.stage import ScrubPiiConfig

ZWSP, SHY, WJ, BOM, RLO = "\u200b", "\u00ad", "\u2060", "\ufeff", "\u202e"

HIDDEN = [
    (f"mail jane{ZWSP}.doe@example.org today", f"jane{ZWSP}.doe@example.org", "email"),
    ("write to bob\uff20corp.example.com", "bob\uff20corp.example.com", "email"),
    (f'aws = "AKIA{WJ}IOSFODNN7EXAMPLE"', f"AKIA{WJ}IOSFODNN7EXAMPLE", "aws_access_key"),
    ("card \uff14\uff11\uff11\uff11 1111 1111 1111 paid", "\uff14\uff11\uff11\uff11 1111 1111 1111", "credit_card"),
    (f"host 10.23.{SHY}45.67 up", f"10.23.{SHY}45.67", "ipv4"),
    (f"token ghp_{BOM}abcdefghijklmnopqrstuvwxyz0123456789 end", f"ghp_{BOM}abcdefghijklmnopqrstuvwxyz0123456789",
     "github_token"),
    (f"call 415-555-{RLO}0132 now", f"415-555-{RLO}0132", "phone"),
]


@pytest.mark.parametrize("text,value,entity", HIDDEN)
@pytest.mark.parametrize("strategy", ["python", "polars", "polars_rows", "hyperscan"])
def test_a_value_with_a_hidden_character_is_found_by_every_strategy(text, value, entity, strategy) -> None:
    [found] = scan_batch([text], strategy=strategy)
    assert [(text[f.start:f.end], f.entity) for f in found] == [(value, entity)]


def test_without_the_fold_the_values_are_missed() -> None:
    """The cases above are real misses of the plain scan (so the fold is what finds them)."""
    from datakit.stages.scrub_pii import scan as scan_module

    for text, value, _ in HIDDEN:
        plain = [f for det in scan_module.DETECTORS for f in scan_module._matches(det, text)]
        assert not any(text[a:b] == value for a, b, _, _ in plain), value


def test_the_replacement_removes_the_hidden_characters_and_a_rescrub_finds_nothing() -> None:
    fn = ScrubPiiConfig(ner="off").build_fn()
    out, found = fn.scrub([t for t, _, _ in HIDDEN])
    assert all(len(fs) == 1 for fs in found)
    for text in out:
        assert ZWSP not in text and WJ not in text and "\uff20" not in text
    assert out[0] == "mail <EMAIL> today"
    again, found_again = fn.scrub(out)
    assert again == out and not any(found_again)


def test_a_hidden_character_gives_the_same_pseudonym_as_the_plain_value() -> None:
    r = Replacer(policies={"email": "pseudonym"}, key=b"k")
    assert r.token("email", f"jane{ZWSP}@x.org") == r.token("email", "jane@x.org") == r.token("email", "jane\uff20x.org")


def test_the_view_maps_back_to_the_text() -> None:
    text = f"{ZWSP}a{ZWSP}{ZWSP}b\uff20c{ZWSP}"
    folded = fold_view(text)
    assert folded.view == "ab@c"
    assert [text[slice(*folded.span(k, k + 1))] for k in range(4)] == ["a", "b", "\uff20", "c"]
    assert text[slice(*folded.span(0, 4))] == f"a{ZWSP}{ZWSP}b\uff20c"  # the hidden characters inside come along
    assert fold_view("plain ascii") is None and fold_text("déjà vu") == "déjà vu"


def test_rows_are_picked_by_one_arrow_pass() -> None:
    arr = pa.array(["ascii", None, "déjà vu", f"x{ZWSP}y", "\uff41", "", "ok\u3000"])
    assert folded_rows(arr) == [3, 4]
    assert folded_rows(pa.array([], pa.string())) == []


def test_a_clean_text_scans_as_before() -> None:
    text = "déjà vu: jane@example.org, 10.0.0.1"
    assert [(f.entity) for f in scan_text(text)] == ["email", "ipv4"]


def test_sentence_marks_alone_do_not_pick_a_row() -> None:
    """`？，！；` are everyday Chinese/Japanese punctuation and fold to marks no value holds: such rows
    are not scanned twice; any other folded character still picks the row."""
    arr = pa.array(["\u4f60\u597d\uff1f", "\u597d\uff0c\u6211\uff01\uff1b", "\u597d\uff1f jane\uff20x.org"])
    assert folded_rows(arr) == [2]
    assert fold_view("\u4f60\u597d\uff1f") is None


def test_hyperscan_gate_picks_the_rows_the_arrow_pass_picks() -> None:
    """The hyperscan strategy picks rows by a byte pattern in its one pass; every character from
    U+0080 to U+FFFF (with ASCII around it) is picked by it exactly when the Arrow pass picks it."""
    pytest.importorskip("hyperscan")
    from datakit.stages.scrub_pii.scan import _Rows, candidate_ends
    from datakit.stages.scrub_pii.fold import FOLD_GATE_BYTES

    texts = [f"a{chr(o)}b" for o in range(0x80, 0x10000) if not 0xD800 <= o <= 0xDFFF] + ["plain", None, ""]
    arr = pa.array(texts, pa.string())
    [gate] = candidate_ends(_Rows(arr), [], (FOLD_GATE_BYTES,))
    assert sorted(gate) == folded_rows(arr)
    assert len(folded_rows(arr)) == 23 + 94 - 4  # invisibles, fullwidth ASCII less the 4 sentence marks
