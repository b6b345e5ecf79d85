"""Person names in code contexts: the `person` pattern detector (author lines, copyright holders,
git trailers, `TODO(name)`), without NER.

Why a pattern detector: NER costs ~1000x the pattern pass and reads chat turns only, while in code a
name nearly always sits in one of these contexts. Each context has positive and negative cases; the
negatives are what real code puts in the same place (organizations, placeholders, identifiers, tags).
"""
from __future__ import annotations

import ast
import json
import random
import re

import polars as pl
import pyarrow as pa
import pytest

from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.scrub_pii import detectors as D
from datakit.stages.scrub_pii.presidio_bridge import pattern_only_analyzer
from datakit.stages.scrub_pii.scan import scan_batch, scan_text
from datakit.stages.scrub_pii.stage import ScrubPiiConfig, scrub_texts
from datakit.synth import plants
from tests.support.presidio_baseline import analyze_findings

PERSON = D.BY_ENTITY["person"]

# (text, the names found in it, in order)
POSITIVES = [
    # author lines, any comment style, and reST / javadoc fields
    ("# Author: Jane Doe\n", ["Jane Doe"]),
    ("#  Author:      Fred L. Drake, Jr.\n", ["Fred L. Drake, Jr."]),
    ("// Authors: Collin Winter, Nick Edds\n", ["Collin Winter, Nick Edds"]),
    (" * @author Jane Doe\n", ["Jane Doe"]),
    ('"""\n:author: Jane Doe\n"""\n', ["Jane Doe"]),
    (".. moduleauthor:: Guido van Rossum <guido@example.org>\n", ["Guido van Rossum"]),
    ("# Maintainer: Ann-Marie O'Brien\n", ["Ann-Marie O'Brien"]),
    ("# Contributors: Jane Doe, Bob Smith and Ann Lee\n", ["Jane Doe, Bob Smith and Ann Lee"]),
    # module metadata and package metadata
    ('__author__ = "Guido van Rossum <guido@example.org>"\n', ["Guido van Rossum"]),
    ("__author__ = ('Ka-Ping Yee <ping@example.org>',\n", ["Ka-Ping Yee"]),
    ('__credits__ = "Gustavo Niemeyer, for the parser."\n', ["Gustavo Niemeyer"]),
    ('setup(name="pkg", author="Jane Doe", author_email="jane@example.org")\n', ["Jane Doe"]),
    ('  "author": "Jane Doe <jane@example.org> (https://example.org)",\n', ["Jane Doe"]),
    ('authors = ["Jane Doe <jane@example.org>"]\n', ["Jane Doe"]),
    ("maintainer: Bob Smith\n", ["Bob Smith"]),
    ('"Last-Translator: J. David Ibanez <jd@example.org>\\n"\n', ["J. David Ibanez"]),
    # prose credits
    ("# Written by Guido van Rossum, 1991.\n", ["Guido van Rossum"]),
    ("Written by Martin v. Löwis.\n", ["Martin v. Löwis"]),
    ("# Created by Pearu Peterson\n", ["Pearu Peterson"]),
    ("# Originally contributed by Sjoerd Mullender.\n", ["Sjoerd Mullender"]),
    ("# Modified by Giampaolo Rodola' to add TLS support.\n", ["Giampaolo Rodola"]),
    ("# Maintained by Michael Foord\n", ["Michael Foord"]),
    ("# Changes and improvements suggested by Steve Majewski.\n", ["Steve Majewski"]),
    ("# Adapted from a patch submitted by Steven J. Burr\n", ["Steven J. Burr"]),
    ("# Modified 04-Oct-1995 by Jack Jansen to use binascii\n", []),  # a date between verb and "by": not read
    # copyright holders (organizations are not names: see NEGATIVES)
    ("# Copyright (c) 2021 Jane Doe <jane.doe@example.org>\n", ["Jane Doe"]),
    ("# Copyright 2001-2019 by Vinay Sajip. All Rights Reserved.\n", ["Vinay Sajip"]),
    ("# Copyright (c) 2006-2008, R Oudkerk\n", ["R Oudkerk"]),
    ("# Copyright (C) 2005-2010   Gregory P. Smith (greg@example.org)\n", ["Gregory P. Smith"]),
    ("# Copyright (c) 2010, Jane Doe, All rights reserved\n", ["Jane Doe"]),
    ("# Copyright 1995-2010 Jean-loup Gailly and Mark Adler\n", ["Jean-loup Gailly and Mark Adler"]),
    ("# Copyright (C) 2007-2012 Michael Foord & the mock team\n", ["Michael Foord"]),
    ("Copyright © 2021-present Jane Doe\n", ["Jane Doe"]),
    # git trailers and `*_by` keys
    ("Fix parser\n\nSigned-off-by: Bob Smith <bob.smith@corp.example.com>\n", ["Bob Smith"]),
    ("Co-authored-by: José Müller <jm@example.de>\n", ["José Müller"]),
    ("Reviewed-by: Jane Doe\nTested-by: Bob Smith\n", ["Jane Doe", "Bob Smith"]),
    ('reported_by = "Jane Doe"\n', ["Jane Doe"]),
    # TODO(name): full names, first names, user handles (Go/Google style)
    ("# TODO(Jane Doe): drop this shim\n", ["Jane Doe"]),
    ("// FIXME(Jane): flaky on windows\n", ["Jane"]),
    ("# TODO(jdoe): revisit\n", ["jdoe"]),
    ("# XXX(nnorwitz): this test leaks fds\n", ["nnorwitz"]),
    ("# TODO(@jdoe) later\n", ["jdoe"]),
    ("# NOTE(anijain2305): keep in sync\n", ["anijain2305"]),
]

# the same contexts holding something that is not a person's name
NEGATIVES = [
    # organizations
    "# Copyright (C) 2001-2022 Python Software Foundation\n",
    "# Copyright 2007 Google, Inc. All Rights Reserved.\n",
    "# Copyright 2015 The Chromium Authors. All rights reserved.\n",
    "# Copyright (c) 1998-2001 by Secret Labs AB.  All rights reserved.\n",
    "# Copyright (c) Microsoft Corporation.\n",
    "# Copyright 2020 Jane Doe, Inc.\n",
    "# Author: Acme Widgets GmbH\n",
    '__author__ = "The Pallets Team"\n',
    "# Maintainer: Debian Python Team\n",
    "Written by Python Software Foundation staff\n",
    "# Written by ACME Widgets\n",  # an acronym is not a name word
    # placeholders and one-word values
    '__author__ = "Your Name"\n',
    "# Author: First Last\n",
    "# Author: Unknown\n",
    "# Author: Guido\n",
    '  "author": "",\n',
    # code, not names
    "author = get_author()\n",
    "author: str\n",
    "author=None\n",
    "self.author = Author(name)\n",
    "authors: list[str] = []\n",
    "if author == 'Jane Doe':\n",
    "created_by = request.user\n",
    "# Created by CreateImage(i)\n",
    "# Created by pytest automatically.\n",
    "# Modified by f(x) below\n",
    "data written by the application\n",
    "rows = sorted(rows)  # sorted by Last Name\n",
    "# Created by Some Random Tool Name\n",
    "# ported to VS 2015 by Steve Dower\n",  # a known limit: only credit verbs right before "by" are read
    "# Generated by Django 3.2 on 2021-05-04\n",
    "'used by Standard C.  The recognized escape sequences are'\n",
    "pts = 'Ax Ay Bx By Cx Cy Dx Dy'.split()\n",
    "# Powered by Apache Kafka\n",
    "# Caused by PathFinder.find_spec\n",
    "# the copyright holder Jane Doe\n",
    "# Copyright notice\n",
    "COPYRIGHT SIGN\n",
    # TODO tags, issue ids, calls
    "# TODO(fix): later\n", "# TODO(perf): cache this\n", "# TODO(Fix): later\n", "# TODO(py311): drop\n",
    "# TODO(b/12345): x\n", "# TODO(#123): x\n", "# TODO(2020-06): x\n", "# NOTE(gh-12139): x\n",
    "# TODO(infer_string): x\n", "# TODO(yaml.comments.CommentedMap): x\n", "# TODO(follow-up): x\n",
    "# TODO(ArrayManager) remove\n", "# TODO(SPARK-49233): x\n", "XXX(s, pos)\n", "# TODO(fix this): x\n",
    "# TODO(jdoe@example.com): x\n",
    # a run of capitalized words longer than a name is a title, not a person
    "# Written by Hand Coded Parser Generator Tool\n",
    # names the prefilter never sees: no context
    "Jane Doe fixed this.\n",
]


def _names(text: str) -> list[str]:
    return [text[f.start : f.end] for f in scan_text(text) if f.entity == "person"]


@pytest.mark.parametrize("text,names", POSITIVES, ids=[t[:40] for t, _ in POSITIVES])
def test_names_in_code_contexts_are_found(text: str, names: list[str]) -> None:
    assert _names(text) == names


@pytest.mark.parametrize("text", NEGATIVES, ids=[t[:40] for t in NEGATIVES])
def test_organizations_placeholders_identifiers_and_tags_are_not_names(text: str) -> None:
    assert _names(text) == []


def test_unicode_names() -> None:
    """Names are Unicode (the pattern compiles with re.ASCII, so the letters are explicit ranges)."""
    for name in ("José Müller", "Gerhard Häring", "Peter Åstrand", "Łukasz Langa", "Marc-André Lemburg",
                 "Nguyễn Văn An", "Ioannis Παπαδόπουλος", "Дмитрий Иванов", "Søren Kierkegaard"):
        assert _names(f"# Author: {name}\n") == [name], name
    # a name cut by an escape is not half-scrubbed (`Gust\u00e4bel` in a Python string)
    assert _names('__author__ = "Lars Gust\\u00e4bel (lars@example.org)"\n') == []
    # scripts without capitals (CJK) are out of scope: a known limit, documented
    assert _names("# Author: 山田太郎\n") == []


def test_only_the_name_is_replaced_and_code_stays_valid() -> None:
    src = ('# Author: Jane Doe <jane@example.org>\n# TODO(jdoe): revisit\n'
           '__author__ = "Guido van Rossum"\nsetup(author="Ann Lee", author_email="ann@example.org")\n')
    out = scrub_texts([src])[0]
    assert out == ('# Author: <PERSON> <<EMAIL>>\n# TODO(<PERSON>): revisit\n'
                   '__author__ = "<PERSON>"\nsetup(author="<PERSON>", author_email="<EMAIL>")\n')
    ast.parse(out)


def test_scrubbing_is_idempotent_on_every_case() -> None:
    texts = [t for t, _ in POSITIVES] + NEGATIVES
    once = scrub_texts(texts)
    assert scrub_texts(once) == once
    assert all(not _names(t) for t in once)
    joined = "".join(texts)  # several contexts in one document
    assert scrub_texts(scrub_texts([joined])) == scrub_texts([joined])


def test_ner_off_still_scrubs_names_in_code_and_counts_them() -> None:
    cfg = ScrubPiiConfig(ner="off")
    assert cfg.build_fn().person is None
    assert scrub_texts(["# Author: Jane Doe\n"], cfg) == ["# Author: <PERSON>\n"]
    batch = pa.RecordBatch.from_pylist([
        {"doc_id": "a", "kind": "code", "segments": [{"text": "# TODO(Jane Doe): x\n# Author: Bob Smith\n",
                                                      "train": True, "role": "code"}],
         "chosen": None, "rejected": None, "source": None, "meta": "{}"},
        {"doc_id": "b", "kind": "code", "segments": [{"text": "x = 1\n", "train": True, "role": "code"}],
         "chosen": None, "rejected": None, "source": None, "meta": "{}"},
    ], schema=TRAINING_RECORD_V1)
    out = cfg.build_fn()(batch).to_pylist()
    assert out[0]["segments"][0]["text"] == "# TODO(<PERSON>): x\n# Author: <PERSON>\n"
    assert json.loads(out[0]["_metrics"]) == {"pii.person": 2}  # the same metric NER counts into
    assert out[1]["segments"][0]["text"] == "x = 1\n"


def test_person_policies_apply_to_pattern_names(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ScrubPiiConfig().policies()["person"] == "placeholder"
    assert ScrubPiiConfig(entities=["person"]).detectors() == (PERSON,)
    drop = ScrubPiiConfig(ner="off", policy={"person": "drop"}).build_fn()
    batch = pa.RecordBatch.from_pylist([
        {"doc_id": "a", "kind": "code", "segments": [{"text": "# Author: Jane Doe\n", "train": True, "role": "code"}],
         "chosen": None, "rejected": None, "source": None, "meta": "{}"}], schema=TRAINING_RECORD_V1)
    assert drop(batch).column("_drop").to_pylist() == ["pii:person"]
    monkeypatch.setenv("DATAKIT_PII_KEY", "test-key")
    pseudo = ScrubPiiConfig(ner="off", policy={"person": "pseudonym"})
    a, b, c = scrub_texts(["# Author: Jane Doe\n", "Signed-off-by: Jane Doe\n", "# Author: Bob Smith\n"], pseudo)
    token = re.search(r"<PERSON_[0-9a-f]{12}>", a)
    assert token and token.group() in b and token.group() not in c  # same name, same pseudonym


def test_synth_person_plants_are_found_without_ner() -> None:
    """The synth generator plants names as `TODO(First Last):` comments in every language it writes."""
    rng = random.Random(7)
    texts, values = [], []
    for lang in ("python", "javascript", "go", "sql", "shell", "yaml"):
        for _ in range(20):
            snippet, found = plants.pii_snippet(rng, "PERSON", lang)
            texts.append("def f():\n    return 1\n" + snippet + "x = 2\n")
            values.append([v for e, v in found if e == "PERSON"])
    chat, chat_found = plants.pii_chat_text(rng, "PERSON")
    texts.append(chat)
    values.append([v for e, v in chat_found if e == "PERSON"])
    assert all(values)
    for t, vs, out in zip(texts, values, scrub_texts(texts, ScrubPiiConfig(ner="off"))):
        for v in vs:
            assert v in t and v not in out


def test_prefilter_is_a_literal_led_superset_of_every_context_form() -> None:
    """Every key, "by" form and tag the Python pattern reads is seen by the Rust prefilter (else polars misses it)."""
    forms = [f"{k}: Jane Doe" for k in (D._PERSON_KEYS + "|" + D._BY_KEYS).split("|")]
    forms += [f"{k} = 'Jane Doe'" for k in (D._PERSON_KEYS + "|" + D._BY_KEYS).split("|")]
    forms += [f"# {v} by Jane Doe" for v in D._BY_PHRASES] + [f"# {v} BY Jane Doe" for v in D._BY_PHRASES]
    forms += ["Written by:   Jane Doe", "# written by Jean-loup Gailly", "# written by O'Neil Roe", "written by J. Doe"]
    forms += [f"{t}(jdoe): x" for t in D._TODO_TAGS.split("|")]
    forms += ["@author Jane Doe", "@maintainer Jane Doe", "Copyright 2020 Jane Doe", "copyright 2020 Jane Doe"]
    forms += [t for t, names in POSITIVES if names]
    assert all(_names(f) for f in forms)
    hit = pl.Series(forms).str.contains(PERSON.rust_prefilter)
    assert hit.all(), [f for f, h in zip(forms, hit) if not h]
    # the prefilter's branches start with literals (Rust's multi-literal search), and the pattern is line-local
    assert not PERSON.multiline and "\n" not in PERSON.pattern and "\\s" not in PERSON.pattern
    texts = [t for t, _ in POSITIVES] + NEGATIVES + ["".join(NEGATIVES + [t for t, _ in POSITIVES])]
    assert scan_batch(texts, strategy="polars") == scan_batch(texts, strategy="python")


def test_presidio_recognizer_finds_the_same_names() -> None:
    analyzer = pattern_only_analyzer()
    for text, _names_ in POSITIVES[:12]:
        assert analyze_findings(analyzer, text) == scan_text(text)
    res = analyzer.analyze(text="# Author: Jane Doe\n", language="en")
    assert [(r.entity_type, r.start, r.end) for r in res] == [("PERSON", 10, 18)]


def test_a_name_found_by_both_ner_and_the_pattern_counts_once() -> None:
    """In a chat turn NER may find the same name as the pattern: one finding, one `pii.person`."""
    from datakit.stages.scrub_pii.ner import installed_spacy_model

    if installed_spacy_model() is None:
        pytest.skip("no spaCy English pipeline installed")
    batch = pa.RecordBatch.from_pylist([
        {"doc_id": "chat", "kind": "sft", "segments": [
            {"text": "The module says 'Written by Maria Garcia' at the top. Who is Tomas Berg?", "train": False,
             "role": "user"}], "chosen": None, "rejected": None, "source": None, "meta": "{}"}],
        schema=TRAINING_RECORD_V1)
    out = ScrubPiiConfig().build_fn()(batch).to_pylist()[0]
    text = out["segments"][0]["text"]
    assert "Maria Garcia" not in text and "Tomas Berg" not in text and text.count("<PERSON>") == 2
    assert json.loads(out["_metrics"]) == {"pii.person": 2}
