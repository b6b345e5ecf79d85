"""The `scrub_pii` stage: scrub every text of a training record, count what was found, drop on policy.

Pipeline file::

    - kind: scrub_pii
      policy: {email: pseudonym, ipv4: placeholder, private_key: drop}   # per entity (optional)
      default_policy: placeholder     # for entities not listed (optional; else each detector's default)
      key_file: /run/secrets/pii_key  # only for pseudonym; else the env var named by key_env
      ner: spacy                      # person-name NER with an installed spaCy model (default; error if
                                      # none); `auto`: use one if installed (recorded); `off`

What is scrubbed: the `text` of every segment, plus `chosen` and `rejected`
(preference pairs), and the record's file path (`source.path`, `meta`'s "path").
The schema stays `training_record.v1`.

Accounting: records whose findings include a drop-policy entity get
`_drop = "pii:<entity>"` (the engine counts and logs them by doc_id). Per-entity
finding counts go out in the `_metrics` column (a JSON object
`{"pii.<entity>": n}` on one row per batch, null elsewhere), which the engine
sums into the stage's `metrics` in `_run.json`. Only counts leave this stage:
never a matched value, in metrics, drop details, logs or errors.
"""
from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator, model_validator

from datakit.contracts import SEGMENT, TRAINING_RECORD_V1
from datakit.plan import DROP, DROP_DETAIL, METRICS, Rel, metrics_column
from datakit.stages.base import CompileContext, StageConfig, register_stage
from datakit.stages.texts import RECORD_TEXT_COLUMNS, record_documents, text_piece, with_texts
from datakit.stages.scrub_pii.detectors import BY_ENTITY, DETECTORS, Detector, Policy
from datakit.stages.scrub_pii.replace import DEFAULT_KEY_ENV, Replacer, load_key
from datakit.stages.scrub_pii.scan import Finding, Strategy, resolve_strategy, scan_batch


METRIC_PREFIX = "pii."
# segment roles that hold natural language (person-name NER runs only there, when available)
# (not "tool": tool output is file contents and command output, i.e. code; not "prompt", nor `chosen` /
# `rejected`: a preference record's prompt is the file before the cursor and its answers are two tab
# completions, i.e. code, where NER replaced identifiers such as `GenericAlias` with <PERSON> (found in
# a docs review: 468 person findings in the 304 pairs of pipelines/preference.yaml on the demo logs,
# 3 without NER, and the stage 250x slower); names in code are the `person` pattern detector's)
PROSE_ROLES = frozenset({"user", "assistant", "system"})
# where a text is natural language: all of it, none, or (start, end) spans of it
Prose = "bool | list[tuple[int, int]]"
# (from numpy arrays: pa.array of a Python list imports pandas, 0.3 CPU-s, to check for pandas types;
# this module is also loaded by every process's log redaction)
_PROSE_ROLES = pa.array(np.array(sorted(PROSE_ROLES)), pa.string())


@register_stage
class ScrubPiiConfig(StageConfig):
    """Config of the PII/secret scrubber (see module docstring for the YAML form)."""

    kind: Literal["scrub_pii"] = "scrub_pii"
    reads = RECORD_TEXT_COLUMNS
    writes = RECORD_TEXT_COLUMNS
    entities: list[str] | None = Field(default=None, description="detector names to run; default: all")
    policy: dict[str, Policy] = Field(default_factory=dict, description="per-entity policy overrides")
    default_policy: Policy | None = Field(default=None, description="policy for entities not in `policy`")
    key_env: str = Field(default=DEFAULT_KEY_ENV, description="env var holding the pseudonym HMAC key")
    key_file: str | None = Field(default=None, description="path to a file holding the pseudonym key")
    ner: Literal["spacy", "auto", "off"] = Field(
        "spacy", description="person-name NER: `spacy` needs an installed English spaCy model (an error "
                             "otherwise: output must not depend on what happens to be installed); `auto` "
                             "allows running without one; `off`. The model used is recorded in the manifest")
    ner_model: str | None = Field(None, description="pin the spaCy model package (default: the preferred "
                                                    "installed English one)")
    extra_recognizers: str | None = Field(
        default=None, description="a presidio recognizer YAML; its recognizers run beside ours (presidio speed)")
    strategy: Strategy = "auto"
    path_fields = ("extra_recognizers", "key_file")

    @field_validator("ner", mode="before")
    @classmethod
    def _yaml_off_is_off(cls, v: object) -> object:
        """`ner: off` in a pipeline file is the boolean false to YAML (1.1: off/no/false), so the
        documented spelling was refused (found in review); false means `off`. True stays an error:
        "on" does not say which of `spacy` and `auto` was meant."""
        return "off" if v is False else v

    @field_validator("strategy")
    @classmethod
    def _strategy_runs_here(cls, v: Strategy) -> Strategy:
        resolve_strategy(v)  # `hyperscan` without the package fails at compile, not in the first batch
        return v

    @field_validator("entities")
    @classmethod
    def _known_entities(cls, v: list[str] | None) -> list[str] | None:
        if v is not None:
            bad = sorted(set(v) - set(BY_ENTITY))
            if bad:
                raise ValueError(f"unknown entities {bad}; known: {sorted(BY_ENTITY)}")
        return v

    @model_validator(mode="after")
    def _known_policy_entities(self) -> "ScrubPiiConfig":
        # entities of a team's extra recognizers are only known once their file is read (at compile)
        if self.extra_recognizers is None:
            bad = sorted(set(self.policy) - set(BY_ENTITY) - {"person"})
            if bad:
                raise ValueError(f"policy names unknown entities {bad}; known: {sorted(BY_ENTITY)}")
        return self

    def detectors(self) -> tuple[Detector, ...]:
        wanted = set(self.entities) if self.entities is not None else None
        return tuple(d for d in DETECTORS if wanted is None or d.entity in wanted)

    def policies(self) -> dict[str, Policy]:
        """The effective policy of every entity (explicit > default_policy > detector default)."""
        out: dict[str, Policy] = {}
        for d in DETECTORS:
            out[d.entity] = self.policy.get(d.entity, self.default_policy or d.default_policy)
        out["person"] = self.policy.get("person", self.default_policy or "placeholder")
        return out

    def build_fn(self, base_dir: str | None = None) -> "ScrubFn":
        """The picklable batch function (loads the pseudonym key here, so a missing key fails at compile)."""
        pol = self.policies()
        key = None
        if "pseudonym" in pol.values():
            key_file = self.key_file
            if key_file and base_dir is not None and not key_file.startswith(("/", "~")):
                key_file = CompileContext(base_dir=Path(base_dir)).resolve(key_file)
            key = load_key(self.key_env, key_file)
        person = None
        if self.ner != "off":
            from datakit.stages.scrub_pii.ner import person_scanner

            person = person_scanner(self.ner_model, required=self.ner == "spacy")
        extra = None
        if self.extra_recognizers:
            from datakit.stages.scrub_pii.presidio_bridge import ExtraRecognizers

            path = self.extra_recognizers
            if base_dir is not None:
                path = CompileContext(base_dir=Path(base_dir)).resolve(path)
            extra = ExtraRecognizers(path)
            known = set(BY_ENTITY) | {"person"} | set(extra.entities())  # loads the file: errors surface now
            bad = sorted(set(self.policy) - known)
            if bad:
                raise ValueError(f"scrub_pii: policy names unknown entities {bad}; known: {sorted(known)}")
        return ScrubFn(self.detectors(), Replacer(pol, key), resolve_strategy(self.strategy), person, extra)

    def drops_by_content(self) -> bool:
        return True  # private keys by default, any entity whose policy is drop, a secret cut by the cursor

    def compile(self, rel: Rel, ctx: CompileContext) -> Rel:
        fn = self.build_fn(str(ctx.base_dir))
        fn.extra_texts = _extra_text_columns(rel.schema)
        for k, v in fn.environment().items():  # what the output depends on beyond this config
            ctx.record(k, v)
        # the records' own schema, so a column an earlier custom stage added is kept (found in review: it was
        # dropped here, silently, while every other stage kept it); its strings are scrubbed (`extra_texts`)
        return rel.map_batches(fn, rel.schema, name="scrub_pii", drop_log_key="doc_id")


def _extra_text_columns(schema: pa.Schema) -> tuple[str, ...]:
    """The string columns of `schema` beyond the record contract's (a custom stage's), which the scrub
    scans like lineage text. A column it cannot scan (nested, binary) is refused: it may hold personal
    data, and passing it through unscanned would publish it."""
    known = set(TRAINING_RECORD_V1.names)
    out = []
    for f in schema:
        if f.name in known:
            continue
        t = f.type.value_type if pa.types.is_dictionary(f.type) else f.type
        if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
            out.append(f.name)
        elif not any(is_(t) for is_ in (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean,
                                        pa.types.is_temporal, pa.types.is_decimal, pa.types.is_null)):
            # found in review: only plain strings were looked at, so a `_`-named, dictionary, string_view or
            # fixed-size binary column passed through unscanned
            raise ValueError(f"scrub_pii cannot scan column {f.name!r} ({f.type}) that an earlier stage added: it may "
                             "hold personal data. Make it a string column, or add it after scrub_pii")
    return tuple(out)


class ScrubFn:
    """RecordBatch -> RecordBatch (+ `_drop`, `_drop_detail`, `_metrics`). Pure and deterministic."""

    MAX_ROUNDS = 4

    def __init__(self, detectors: tuple[Detector, ...], replacer: Replacer, strategy: Strategy = "auto",
                 person=None, extra=None) -> None:
        self.detectors = detectors
        self.replacer = replacer
        self.strategy = strategy
        self.person = person  # the NER scanner of person names (ner.PersonNameScanner) or None
        self.extra = extra  # a team's presidio recognizers (ExtraRecognizers) or None
        self.extra_texts: tuple[str, ...] = ()  # string columns a custom stage added: scanned like lineage

    def setup(self) -> None:
        """Load what the scan needs beyond its config, once per worker process (the engines call this):
        the NER model (checked against the driver's version) and a team's presidio recognizers."""
        if self.person is not None:
            self.person.setup()
        if self.extra is not None:
            self.extra.setup()

    @property
    def line_detectors(self) -> tuple[Detector, ...]:
        return tuple(d for d in self.detectors if not d.multiline)

    def __repr__(self) -> str:  # never show the key
        return f"ScrubFn({len(self.detectors)} detectors, strategy={self.strategy})"

    def environment(self) -> dict[str, object]:
        """What this function's output depends on besides its config: the scan strategy it resolved to,
        the NER model and library versions, the pseudonym key (as a one-way fingerprint), a team's
        recognizer file. Recorded in the manifest and folded into the config hash."""
        import hashlib

        from datakit.io.identity import library_version

        env: dict[str, object] = {"strategy": self.strategy}
        if self.strategy == "hyperscan":
            env["hyperscan"] = library_version("hyperscan")
        env["ner"] = self.person.environment() if self.person is not None else None
        if self.replacer.key is not None:
            env["pseudonym_key"] = hmac.new(self.replacer.key, b"datakit key fingerprint",
                                            hashlib.sha256).hexdigest()[:16]
        if self.extra is not None:
            from datakit.io.atomic import sha256_file

            env["extra_recognizers"] = sha256_file(self.extra.conf_file)
            env["presidio_analyzer"] = library_version("presidio_analyzer")
        return env

    def scan(self, texts: "list[str | None] | pa.Array", prose: "list[Prose] | None" = None,
             suppressed: set[int] | None = None, texts_out: dict[int, str | None] | None = None
             ) -> list[list[Finding]]:
        """Findings per text: the batch scanner, plus NER names in `prose` parts, plus a team's recognizers.

        `prose[i]` says where text i is natural language: True (all of it), False,
        or a list of (start, end) spans (the chat turns of a joined record). Only
        those texts become Python strings for NER.

        Secrets split across string literals (`"ghp_abc" "def..."`, `"sk-" + "..."`)
        are joined by `literals.find_split_secrets` (rows picked by a Rust regex gate)
        and merged with the scanner's findings by detector priority, so the joined
        token replaces the generic finding on its first fragment.
        """
        from datakit.stages.scrub_pii.literals import (GATE_CONT, QUOTE_SPAN_ENTITIES, ROW_GATE, find_split_secrets,
                                                 merge_findings, settle_line_merges)

        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        # the split-literal row gate rides along in hyperscan's one pass; the finer GATE then runs on
        # the rows it picks (under the other strategies find_split_secrets runs its own gate passes)
        gate_ends: list[dict[int, list[int]]] = []
        strings: dict[int, str | None] = {} if texts_out is None else texts_out  # rows already in Python
        found = scan_batch(texts, self.detectors, self.strategy, suppressed, (ROW_GATE, GATE_CONT), gate_ends,
                           strings)
        split = find_split_secrets(texts, self.detectors, gated=self.strategy != "python",
                                   candidate_rows=sorted(set(gate_ends[0]) | set(gate_ends[1])) if gate_ends else None)
        priority = {d.entity: d.priority for d in self.detectors}
        if split:
            found = merge_findings(found, split, priority, suppressed)
        if self.person is not None and prose is not None:
            want = [i for i, p in enumerate(prose) if p]
            if want:
                sub = _strings(texts, want, strings)
                named = self.person.add_names(sub, [prose[i] for i in want], [found[i] for i in want])
                found = list(found)
                for i, fs in zip(want, named):
                    found[i] = fs
        if self.extra is not None:
            py = texts.to_pylist() if isinstance(texts, pa.Array) else texts
            found = self.extra.add(py, found)
        # a replacement that joins lines (a split secret, a PEM block) or removes a quote (`O'Brien`) can
        # change how the literals after it lex: settle those rows here (later rounds recheck lines only).
        # Rows: split secrets, multi-line spans, values that can hold a quote (NER names too) and a team's
        # entities (unknown shapes); settle_line_merges then checks the actual values
        relex = {d.entity for d in self.detectors if d.multiline} | QUOTE_SPAN_ENTITIES
        known = {d.entity for d in self.detectors} | {"person"}
        joined = sorted(set(split) | {i for i, fs in enumerate(found)
                                      if fs and any(f.entity in relex or f.entity not in known for f in fs)})
        if joined:
            got = _strings(texts, joined, strings)
            found = list(found)
            settle_line_merges({i: t for i, t in zip(joined, got) if t}, found, self.detectors, priority,
                               self.replacer.token, suppressed)
        return found

    def scrub(self, texts: list[str | None], prose: "list[Prose] | None" = None
              ) -> tuple[list[str | None], list[list[Finding]]]:
        """Scrub independent texts; returns the new texts and every finding (see `scrub_units`)."""
        units, found = self.scrub_units([[t] for t in texts], [""] * len(texts), prose)
        return [u[0] for u in units], found

    def scrub_units(self, units: list[list[str | None]], seps: list[str], prose: "list[Prose] | None" = None,
                    first: list[list[Finding]] | None = None, first_suppressed: set[int] | None = None
                    ) -> tuple[list[list[str | None]], list[list[Finding]]]:
        """Scrub units of text parts that are scanned as one document (`sep.join(parts)`).

        Why units: a FIM record's prefix/middle/suffix are one file cut in
        three, so `DB_PASSWORD = "` | `Tr0ub4dor&3` | `"` is only a secret when
        read together. A finding spanning parts puts its replacement in the
        first part it touches and removes the rest from the others.

        Replacement repeats until a scan finds nothing new (idempotent by
        construction): one round is almost always enough; another is needed
        only when a higher-priority span hid an overlapping lower one (a JWT
        glued to a PEM header), so only those units are re-scanned (the
        property test checks idempotence holds). Returns new units and every
        finding of every round.
        `first` (optional) are the first round's findings, when the caller already
        scanned the joined texts (the batch path scans Arrow columns directly).
        """
        out = [list(u) for u in units]
        found_all: list[list[Finding]] = [[] for _ in units]
        # round 1: whole units
        joined = [seps[i].join(t or "" for t in u) if len(u) != 1 else u[0] for i, u in enumerate(out)]
        sup: set[int] = set()
        if first is not None:
            found = first
            sup = set(range(len(units))) if first_suppressed is None else set(first_suppressed)
        else:
            found = self.scan(joined, prose, sup)
        full: list[int] = []  # units to rescan whole
        windows: dict[int, list[tuple[int, int]]] = {}  # unit -> token spans to recheck around
        for i, fs in enumerate(found):
            if not fs:
                continue
            found_all[i].extend(fs)
            if len(out[i]) == 1 and (i not in sup or self.extra is None):
                new_text, spans = self.replacer.apply_spans(joined[i], fs)  # type: ignore[arg-type]
                out[i] = [new_text]
                # a dropped candidate that stuck out of a replaced span is line-local, so it lies on
                # the line of that span's token: rechecking the lines of every token covers it
                # (a team's presidio recognizers need not be line-local: those units rescan whole)
                risky = spans if i in sup else _risky_spans(new_text, spans)
                if risky:
                    windows[i] = risky
            else:
                out[i] = self._apply_parts(out[i], seps[i], joined[i], fs)  # type: ignore[arg-type]
                full.append(i)
        # later rounds: a replacement can only create a new match (a) where a dropped overlapping
        # candidate stuck out of the replaced span (on the lines of the tokens), or anywhere in a
        # multi-part unit (rescanned whole); (b) on the lines around a token (lookarounds now see
        # `<...>` instead of the old text): rescan just those lines with the line-local detectors.
        for _round in range(1, self.MAX_ROUNDS):
            if not full and not windows:
                break
            nxt_full: list[int] = []
            nxt_windows: dict[int, list[tuple[int, int]]] = {}
            if full:
                jt = [seps[i].join(t or "" for t in out[i]) if len(out[i]) != 1 else out[i][0] for i in full]
                sup = set()
                found = self.scan(jt, None, sup)  # NER runs in round 1 only (its names are replaced)
                for k, (i, text, fs) in enumerate(zip(full, jt, found)):
                    if fs:
                        found_all[i].extend(fs)
                        out[i] = self._apply_parts(out[i], seps[i], text, fs)  # type: ignore[arg-type]
                        nxt_full.append(i)
            if windows:
                wtexts, wmeta = [], []
                for i, spans in windows.items():
                    text = out[i][0]
                    assert text is not None
                    for a, b in _merge_lines(text, spans):
                        wtexts.append(text[a:b])
                        wmeta.append((i, a))
                wsup: set[int] = set()
                wfound = scan_batch(wtexts, self.line_detectors, self.strategy, wsup)
                sup_units = {wmeta[k][0] for k in wsup}
                per_unit: dict[int, list[Finding]] = {}
                for (i, a), fs in zip(wmeta, wfound):
                    per_unit.setdefault(i, []).extend(Finding(f.start + a, f.end + a, f.entity) for f in fs)
                for i, fs in per_unit.items():
                    if fs:
                        fs.sort()
                        found_all[i].extend(fs)
                        new_text, spans = self.replacer.apply_spans(out[i][0], fs)  # type: ignore[arg-type]
                        out[i] = [new_text]
                        risky = spans if i in sup_units else _risky_spans(new_text, spans)
                        if risky:
                            nxt_windows[i] = risky
            full, windows = nxt_full, nxt_windows
        return out, found_all

    def _apply_parts(self, parts: list[str | None], sep: str, joined: str, fs: list[Finding]) -> list[str | None]:
        if len(parts) == 1:
            return [self.replacer.apply(joined, fs)]
        bounds, pos = [], 0
        for t in parts:
            bounds.append((pos, pos + len(t or "")))
            pos += len(t or "") + len(sep)
        edits: list[list[tuple[int, int, str]]] = [[] for _ in parts]
        for f in fs:
            first = True
            for k, (s0, e0) in enumerate(bounds):
                a, b = max(f.start, s0), min(f.end, e0)
                if a < b or (a == b == s0 == e0 and s0 <= f.start < e0):
                    token = self.replacer.token(f.entity, joined[f.start : f.end]) if first else ""
                    edits[k].append((a - s0, b - s0, token))
                    first = False
        new: list[str | None] = []
        for t, ed in zip(parts, edits):
            if not ed:
                new.append(t)
                continue
            chunks, p0 = [], 0
            for a, b, tok in ed:
                chunks += [t[p0:a], tok]  # type: ignore[index]
                p0 = b
            chunks.append(t[p0:])  # type: ignore[index]
            new.append("".join(chunks))
        return new

    def __call__(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        n = batch.num_rows
        names = batch.schema.names
        # the texts, as `datakit.stages.texts` defines them: each record's segments read as one document
        # (a FIM record prefix-middle-suffix joined with nothing, turns with a blank line), then `chosen`,
        # then `rejected`; a finding maps back to segments through `docs.parts`, and `with_texts` writes back
        seg = text_piece("segments", batch.column("segments") if "segments" in names
                         else pa.nulls(n, pa.list_(SEGMENT)))
        docs = record_documents(seg)
        seg_text = seg.texts
        chosen: pa.Array = batch.column("chosen") if "chosen" in names else pa.nulls(n, pa.string())
        rejected: pa.Array = batch.column("rejected") if "rejected" in names else pa.nulls(n, pa.string())

        # Units, scanned together in one Arrow column: the records' documents, then `chosen`, then
        # `rejected` (columns that are all null are not scanned). Common case (one segment per record,
        # no FIM), the segment text column *is* the record column and no per-row Python runs before
        # the scan; only units with findings become Python strings.
        want_prose = self.person is not None
        seg_prose = (_prose_segments(seg.roles, seg_text) if want_prose and seg.roles is not None else
                     np.zeros(len(seg_text), bool) if want_prose else None)
        prose: list[Prose] = [False] * n
        if docs.order is None:
            if seg_prose is not None:
                prose = seg_prose.tolist()
        elif seg_prose is not None:  # where each record's prose segments lie in its document
            seg_len = pc.fill_null(pc.utf8_length(seg_text.cast(pa.string())), 0).to_numpy(zero_copy_only=False)
            row_prose = (np.bincount(seg.rows, weights=seg_prose, minlength=n) > 0 if len(seg_text)
                         else np.zeros(n, bool))
            for row in np.flatnonzero(row_prose).tolist():
                spans, pos, sep_len = [], 0, len(docs.seps[row])
                for i in docs.parts(row):
                    if seg_prose[i]:
                        spans.append((pos, pos + int(seg_len[i])))
                    pos += int(seg_len[i]) + sep_len
                prose[row] = spans
        parts_cols = [docs.texts.cast(pa.string())]
        scanned = [0]  # unit offset of each scanned column: records 0, chosen n, rejected 2n
        for k, col in ((1, chosen), (2, rejected)):
            if col.null_count < n:
                parts_cols.append(col.cast(pa.string()))
                scanned.append(k * n)
                prose += [False] * n  # a preference pair's completions: code (PROSE_ROLES)
        column = parts_cols[0] if len(parts_cols) == 1 else pa.concat_arrays(parts_cols)
        suppressed_c: set[int] = set()
        strings: dict[int, str | None] = {}  # column rows the scan already made Python strings
        found_c = self.scan(column, prose if want_prose else None, suppressed_c, strings)
        # column position -> unit id (u < n: record, n <= u < 2n: chosen, 2n <= u: rejected)
        unit_of = lambda c: scanned[c // n] + c % n  # noqa: E731
        hit_c = [c for c, fs in enumerate(found_c) if fs]
        hits = [unit_of(c) for c in hit_c]
        suppressed = {unit_of(c) for c in suppressed_c}

        def _unit_parts(u: int) -> list[str | None]:
            if u >= n:
                return [(chosen if u < 2 * n else rejected)[u % n].as_py()]
            return [seg_text[i].as_py() for i in docs.parts(u)]

        if hits and docs.order is None:  # one Arrow take for the records' texts
            rec = [u for u in hits if u < n]
            got = dict(zip(rec, _strings(column, rec, strings)))  # records are the column's first n rows
            parts = [[got[u]] if u < n else _unit_parts(u) for u in hits]
        else:
            parts = [_unit_parts(u) for u in hits]
        new_parts, found_hits = self.scrub_units(
            parts, [docs.seps[u] if u < n and docs.seps else "" for u in hits], None, [found_c[c] for c in hit_c],
            {k for k, u in enumerate(hits) if u in suppressed})

        new: dict[str, dict[int, str | None]] = {c: {} for c in RECORD_TEXT_COLUMNS if c in names}
        found: dict[int, list[Finding]] = {}
        for u, old_u, new_u, fs in zip(hits, parts, new_parts, found_hits):
            found[u] = fs
            if u < n:
                for i, t_old, t in zip(docs.parts(u), old_u, new_u):
                    if t != t_old:
                        new["segments"][i] = t
            elif new_u[0] != old_u[0]:
                new["chosen" if u < 2 * n else "rejected"][u % n] = new_u[0]

        # a name found in one place of a record is replaced everywhere in that record
        names_of: dict[int, set[str]] = {}
        for c in hit_c:
            person = [f for f in found_c[c] if f.entity == "person"]
            if person:
                text = _strings(column, [c], strings)[0] or ""
                names_of.setdefault(unit_of(c) % n, set()).update(
                    v for f in person if len(v := text[f.start:f.end].strip()) >= 3)

        # lineage: the file path and language (in `source` and `meta`) are texts too
        new_lineage, lineage_found = self._scrub_lineage(batch) if "source" in names else ({}, {})
        # and a custom stage's string columns: free text a stage wrote (a summary, a commit message), so
        # read with NER like a chat turn; their names join the record's (found in review: a name
        # pseudonymized in the segments stayed in clear in such a column, a key to the pseudonym)
        extra_values: dict[str, list[str | None]] = {}
        for name in self.extra_texts:
            if name in names:
                col, fs = self._scrub_strings(batch.column(name), names_of=names_of)
                if col is not None:
                    extra_values[name] = col.to_pylist()
                for r, f in fs.items():
                    lineage_found.setdefault(r, []).extend(f)
        if names_of:
            for r, k in self._spread_names(names_of, docs, seg_text, chosen, rejected, new).items():
                found.setdefault(r, []).extend([Finding(0, 0, "person")] * k)
                hits.append(r)
            for name in self.extra_texts:
                if name in names:
                    values = extra_values.get(name)
                    values, made = self._spread_names_in(
                        names_of, values if values is not None else _as_string_array(batch.column(name)).to_pylist())
                    if made:
                        extra_values[name] = values
                        for r, k in made.items():
                            lineage_found.setdefault(r, []).extend([Finding(0, 0, "person")] * k)
        for name, values in extra_values.items():
            typ = batch.schema.field(name).type
            col = pa.array(values, pa.string())
            new_lineage[name] = (col.cast(typ.value_type).dictionary_encode().cast(typ) if pa.types.is_dictionary(typ)
                                 else col.cast(typ))

        # accounting only over rows with findings
        counts: dict[str, int] = {}
        drop: list[str | None] = [None] * n
        detail: list[str | None] = [None] * n
        for r in sorted({u % n for u in hits} | set(lineage_found)):
            fs = found.get(r, []) + found.get(n + r, []) + found.get(2 * n + r, []) + lineage_found.get(r, [])
            per: dict[str, int] = {}
            for f in fs:
                per[f.entity] = per.get(f.entity, 0) + 1
            for e, c in per.items():
                counts[e] = counts.get(e, 0) + c
            d = self.replacer.drop_reason(fs)
            if d:
                drop[r] = d
                detail[r] = json.dumps(dict(sorted(per.items())))
        for r, fs in self._split_at_cursor(docs.texts, chosen, rejected).items():
            for f in fs:
                counts[f.entity] = counts.get(f.entity, 0) + 1
            if drop[r] is None:
                drop[r] = f"pii:{fs[0].entity}"
                detail[r] = json.dumps({"split_at_cursor": sorted({f.entity for f in fs})})
        out = with_texts(batch, new)
        for name, col in new_lineage.items():
            out = out.set_column(out.schema.get_field_index(name), out.schema.field(name), col)
        kept = next((i for i, d in enumerate(drop) if d is None), 0)
        metrics = metrics_column(n, {METRIC_PREFIX + e: c for e, c in counts.items()}, kept)
        arrays = out.columns + [pa.array(drop, pa.string()), pa.array(detail, pa.string()), metrics]
        fields = list(out.schema) + [pa.field(DROP, pa.string()), pa.field(DROP_DETAIL, pa.string()),
                                     pa.field(METRICS, pa.string())]
        return pa.RecordBatch.from_arrays(arrays, schema=pa.schema(fields))


    # how much of a prompt's end and of a completion's start are read as one text (`_split_at_cursor`): more
    # than any detector's value is long (a 256-char PEM body line stays a `-----BEGIN` away, found on its own)
    SPLIT_WINDOW = 256

    def _split_at_cursor(self, prompts: pa.Array, chosen: pa.Array, rejected: pa.Array) -> dict[int, list[Finding]]:
        """Rows of preference pairs whose prompt's end and a completion's start form one finding.

        Why: the prompt is the text before the cursor and `chosen`/`rejected` what was typed there, so a
        key the cursor cut (`GITHUB_TOKEN = "ghp_aB3dE5gH7jK9` | `mN1pQ3sT5...`) is one secret in neither
        column alone; found in review, it survived in the pair while the event's FIM and code records lost
        it. Such a pair is dropped (`pii:<entity>`): a completion that starts inside a secret is no example
        to keep in any scrubbed form."""
        n = len(prompts)
        if chosen.null_count == n and rejected.null_count == n:
            return {}
        rows, texts, cuts = [], [], []
        pairs = pc.or_(chosen.is_valid(), rejected.is_valid()).to_numpy(zero_copy_only=False)
        for r in np.flatnonzero(pairs).tolist():
            p = prompts[r].as_py()
            if not p:
                continue
            tail = p[-self.SPLIT_WINDOW:]
            for col in (chosen, rejected):
                c = col[r].as_py()
                if c:
                    rows.append(r)
                    texts.append(tail + c[:self.SPLIT_WINDOW])
                    cuts.append(len(tail))
        if not texts:
            return {}
        out: dict[int, list[Finding]] = {}
        for r, fs, k in zip(rows, self.scan(pa.array(texts, pa.string())), cuts):
            across = [f for f in fs if f.start < k < f.end]
            if across:
                out.setdefault(r, []).extend(across)
        return out

    def _spread_names(self, names_of: dict[int, set[str]], docs: Any, seg_text: pa.Array, chosen: pa.Array,
                      rejected: pa.Array, new: dict[str, dict[int, str | None]]) -> dict[int, int]:
        """Replace, in every text of record r, each person name `names_of[r]` that was found somewhere in
        it; returns {record: replacements made}.

        Why: found in review, NER read "Rajesh Kumar" as a name in the assistant's turn but not in the
        user's, so one record held both `<PERSON_be06db25c3c3>` and the name in clear: a key to that
        pseudonym everywhere in the dataset (and the name in training text). A name is whole words."""
        made: dict[int, int] = {}
        for r, found_names in names_of.items():
            pattern = _name_pattern(found_names)
            places: list[tuple[str, int, str | None]] = [("segments", i, seg_text[i].as_py()) for i in docs.parts(r)]
            places += [(name, r, col[r].as_py()) for name, col in (("chosen", chosen), ("rejected", rejected))]
            for column, i, original in places:
                if column not in new:
                    continue
                text = new[column].get(i, original)
                if not text:
                    continue
                text, k = pattern.subn(self._person_token, text)
                if k:
                    new[column][i] = text
                    made[r] = made.get(r, 0) + k
        return made

    def _person_token(self, m: "re.Match[str]") -> str:
        """The replacement of a name found elsewhere in its record (`_spread_names`, `_spread_names_in`)."""
        return self.replacer.token("person", m.group(0))

    def _spread_names_in(self, names_of: dict[int, set[str]], values: list[str | None]
                         ) -> tuple[list[str | None], dict[int, int]]:
        """`values` (one string per record) with each record's names replaced (as `_spread_names`)."""
        made: dict[int, int] = {}
        out = values
        for r, found_names in names_of.items():
            text = values[r]
            if not text:
                continue
            text, k = _name_pattern(found_names).subn(self._person_token, text)
            if k:
                out = list(out) if out is values else out
                out[r] = text
                made[r] = k
        return out, made

    def _scrub_strings(self, values: pa.Array | pa.ChunkedArray, changed: dict[int, tuple[str, str]] | None = None,
                       names_of: dict[int, set[str]] | None = None
                       ) -> tuple[pa.Array | None, dict[int, list[Finding]]]:
        """A string-like column scrubbed by every detector: (the new column, or None when nothing changed;
        {row: findings}). `changed` (optional) gets {row: (old, new)} of the values replaced. With
        `names_of` (a custom stage's column: free text) NER reads each value as prose too, and the names
        it finds are added to `names_of`, so they are replaced in the record's other texts."""
        values = _as_string_array(values)
        prose: list[Prose] | None = ([True] * len(values) if names_of is not None and self.person is not None
                                     else None)
        found = self.scan(values, prose)  # one Arrow pass; only rows with findings become Python strings
        rows = [i for i, fs in enumerate(found) if fs]
        if not rows:
            return None, {}
        old = [values[i].as_py() for i in rows]
        if names_of is not None:
            for i, was in zip(rows, old):
                names = {v for f in found[i] if f.entity == "person" and len(v := (was or "")[f.start:f.end].strip()) >= 3}
                if names:
                    names_of.setdefault(i, set()).update(names)
        scrubbed, fs_rows = self.scrub(old, [True] * len(old) if prose is not None else None)
        new_values = values.to_pylist()
        findings: dict[int, list[Finding]] = {}
        for i, was, now, fs in zip(rows, old, scrubbed, fs_rows):
            new_values[i] = now
            findings.setdefault(i, []).extend(fs)
            if now != was and changed is not None:
                changed[i] = (was, now)
        return pa.array(new_values, pa.string()), findings

    def _scrub_lineage(self, batch: pa.RecordBatch) -> tuple[dict[str, pa.Array], dict[int, list[Finding]]]:
        """The records' free-text lineage (`LINEAGE_TEXTS` of `source`, and the same keys of `meta`)
        scrubbed: ({column: new array} of `source` and `meta` where a value changed, {row: findings}).

        Why: editor logs carry absolute paths, and `/Users/jane.doe/project/app.py` went to the output
        in `source.path` and in `meta`'s "path" while the same text in a segment was scrubbed (found in
        a privacy review); `file.language` is whatever the editor sent, and an e-mail or an AWS key there
        reached the records, `_run.json`'s profile keys and the report's charts (found in a later
        review). A value is scanned by every detector but NER (a path is not prose) and replaced as a
        segment's text would be, so a pseudonym is the same in both; findings count and drop like any
        other. `meta` is rewritten only where its key holds the old value, with extract's own JSON
        settings (sorted keys, compact, non-ASCII kept), so other rows keep their bytes.
        """
        source = batch.column("source")
        if isinstance(source, pa.ChunkedArray):
            source = source.combine_chunks()
        t = source.type
        fields = [f for f in LINEAGE_TEXTS if t.get_field_index(f) >= 0]
        children = {f: source.field(f) for f in fields}
        findings: dict[int, list[Finding]] = {}
        changed: dict[str, dict[int, tuple[str, str]]] = {}
        for f in fields:
            new_values, found = self._scrub_strings(children[f], changed.setdefault(f, {}))
            for i, fs in found.items():
                findings.setdefault(i, []).extend(fs)
            if new_values is not None:
                children[f] = new_values
        changed = {f: rows for f, rows in changed.items() if rows}
        out: dict[str, pa.Array] = {}
        if changed:
            arrays = [children.get(t.field(k).name, source.field(k)) for k in range(t.num_fields)]
            out["source"] = pa.StructArray.from_arrays(arrays, fields=list(t), mask=source.is_null())
            if "meta" in batch.schema.names:
                meta = batch.column("meta").to_pylist()
                for i in sorted({i for rows in changed.values() for i in rows}):
                    m = json.loads(meta[i]) if meta[i] else None
                    if not isinstance(m, dict):
                        continue
                    for f, rows in changed.items():
                        if i in rows and m.get(f) == rows[i][0]:
                            m[f] = rows[i][1]
                    meta[i] = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                out["meta"] = pa.array(meta, pa.string())
        if "meta" in batch.schema.names:
            new_meta = self._scrub_meta_texts(out.get("meta", batch.column("meta")), findings)
            if new_meta is not None:
                out["meta"] = new_meta
        return out, findings

    def _scrub_meta_texts(self, meta: pa.Array | pa.ChunkedArray, findings: dict[int, list[Finding]]
                          ) -> pa.Array | None:
        """`meta`'s own free-text keys (`META_TEXTS`: the commit a client sent, the tool names of an agent
        step) scrubbed in place, or None when nothing changed; findings added to `findings`.

        Why: found in a hostile-input review, an e-mail and an AWS key sent as `repo.commit` and an e-mail
        as a tool's name reached the output in `meta`. Only rows whose meta text has a finding at all
        are parsed (one Arrow scan of the column picks them)."""
        col = _as_string_array(meta)
        # only the values of those keys are scanned (pulled out by an Arrow regex): the whole meta text holds
        # paths and commit hashes that every batch's scan would turn into Python candidates for nothing
        rows_set: set[int] = set()
        for pattern in _META_VALUE_PATTERNS:
            values = pc.struct_field(pc.extract_regex(col, pattern), "v")  # null where the key is absent
            if values.null_count < len(values):
                rows_set.update(i for i, fs in enumerate(self.scan(values)) if fs)
        rows = sorted(rows_set)
        if not rows:
            return None
        values = col.to_pylist()
        changed = False
        for i in rows:
            try:
                m = json.loads(values[i])
            except (TypeError, ValueError):
                continue
            if not isinstance(m, dict):
                continue
            hit = False
            for k in META_TEXTS:
                v = m.get(k)
                texts = [v] if isinstance(v, str) else v if isinstance(v, list) else None
                if not texts or not all(isinstance(x, str) or x is None for x in texts):
                    continue
                new, fs = self.scrub(texts)
                for f in fs:
                    findings.setdefault(i, []).extend(f)
                if new != texts:
                    m[k] = new[0] if isinstance(v, str) else new
                    hit = True
            if hit:
                values[i] = json.dumps(m, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                changed = True
        return pa.array(values, pa.string()) if changed else None


def _name_pattern(names: set[str]) -> "re.Pattern[str]":
    """Any of `names` as whole words, longest first."""
    import re

    return re.compile(r"(?<!\w)(?:" + "|".join(re.escape(x) for x in sorted(names, key=lambda x: (-len(x), x)))
                      + r")(?!\w)")


def _as_string_array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A string-like column (dictionary, large_string, string_view) as one plain string array."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if pa.types.is_dictionary(values.type):
        values = values.cast(values.type.value_type)
    return values.cast(pa.string())


# the record's lineage fields that hold free text from the editor (scrubbed like a segment's text)
LINEAGE_TEXTS = ("path", "language", "repo_id")
# free text only in a record's `meta` (extract.rules): the commit a client sent, an agent step's tool names
META_TEXTS = ("commit", "tool_names")
# each key's value in a meta JSON text (a string, or a list of strings), for the scan that picks the rows
_META_VALUE_PATTERNS = (r'"commit"\s*:\s*"(?P<v>(?:[^"\\]|\\.)*)"', r'"tool_names"\s*:\s*(?P<v>\[[^\]]*\])')


def _prose_segments(roles: pa.Array, texts: pa.Array) -> np.ndarray:
    """Which segments are natural language NER should read: the prose roles, minus tool calls.

    Why not tool calls: an assistant tool call is rendered by extract as `{"arguments": ..., "name": ...}`
    JSON (`extract.rules._tool_call_text`): arguments to a function (paths, patches, commands), i.e.
    code like the `tool` output it produces, whose names are the `person` pattern detector's. On the
    quickstart's synthetic logs these were 82% of the bytes NER read (patches in `apply_patch` calls).
    """
    prose = pc.fill_null(pc.is_in(roles, _PROSE_ROLES), False)
    text = texts.cast(pa.string())
    tool_call = pc.and_(pc.equal(roles, "assistant"),
                        pc.and_(pc.starts_with(text, _TOOL_CALL_START), pc.ends_with(text, "}")))
    return pc.and_not(prose, pc.fill_null(tool_call, False)).to_numpy(zero_copy_only=False)


# how extract renders a tool call: json.dumps({"arguments": ..., "name": ...}, sort_keys=True)
_TOOL_CALL_START = '{"arguments": '


# A token between two of these characters cannot change what any detector sees next to it:
# no pattern matches `<`/`>`, and look-arounds reach at most two characters, which are unchanged.
_SAFE_NEIGHBOURS = frozenset(" \t\n\r\"'`,;()[]{}=:")


def _risky_spans(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Token spans whose neighbours could now complete a match the old text blocked (`1.2.3.4x@y.z`)."""
    return [(a, b) for a, b in spans
            if (a > 0 and text[a - 1] not in _SAFE_NEIGHBOURS) or (b < len(text) and text[b] not in _SAFE_NEIGHBOURS)]


def _merge_lines(text: str, spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The whole lines around each span, merged where they touch (sorted)."""
    out: list[tuple[int, int]] = []
    for a, b in spans:
        la = text.rfind("\n", 0, a) + 1
        lb = text.find("\n", b)
        lb = len(text) if lb < 0 else lb
        if out and la <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], lb))
        else:
            out.append((la, lb))
    return out


def _strings(texts: "list[str | None] | pa.Array", idx: list[int], known: dict[int, str | None]) -> list[str | None]:
    """`texts[i]` for i in `idx` as Python strings: from `known` where the scan already converted them,
    else with one Arrow `take` for the rest (and remembered in `known`)."""
    if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
        return [texts[i] for i in idx]
    missing = [i for i in idx if i not in known]
    if missing:
        known.update(zip(missing, texts.take(pa.array(missing, pa.int64())).to_pylist()))
    return [known[i] for i in idx]


def scrub_texts(texts: list[str | None], config: ScrubPiiConfig | None = None) -> list[str | None]:
    """Convenience: scrub plain strings with a config's detectors and policy (drop acts like placeholder)."""
    cfg = config or ScrubPiiConfig(ner="off")
    return cfg.build_fn().scrub(texts)[0]


__all__ = ["ScrubPiiConfig", "ScrubFn", "scrub_texts", "METRICS"]
