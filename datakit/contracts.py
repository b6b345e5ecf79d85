"""Arrow schemas of the data contracts (editor event v1, training record v1).

Why a module and not only JSON files: every stage and both engines need the
*same* `pyarrow.Schema` objects — byte-identical output starts with identical
types (e.g. `string`, never `large_string`). The human-readable contract lives
in `datakit/schemas/*.json` (shipped in the package, read with importlib.resources;
the repository's top-level `schemas/` is a symlink to it); `tests/test_contracts.py`
checks the two agree.
"""
from __future__ import annotations

import hashlib

import pyarrow as pa

from datakit.resources import schema_document

DOC_ID_SEP = "\x1f"


def doc_id(*parts: str) -> str:
    """training_record.v1's `doc_id` rule: sha256 hex of the parts (event id, kind, and for preference the
    rejected event id) joined by \\x1f (schemas/training_record.v1.json). Here, with the contract, so that
    extract (which assigns ids) and synth (which maps its ground truth to records) share it without synth
    importing a stage."""
    return hashlib.sha256(DOC_ID_SEP.join(parts).encode("utf-8")).hexdigest()


EVENT_TYPES = ("tab_completion", "inline_edit", "chat_turn", "agent_step")
OUTCOMES = ("accepted", "rejected", "partial", "ignored")
MESSAGE_ROLES = ("system", "user", "assistant", "tool")
RECORD_KINDS = ("code", "fim", "sft", "preference", "feedback")

MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string()), ("tool_name", pa.string())])

EDITOR_EVENT_V1 = pa.schema(
    [
        ("event_id", pa.string()),
        ("event_type", pa.string()),
        ("timestamp", pa.string()),  # ISO-8601 UTC, "2026-11-01T12:00:00.123Z"; strings keep engines byte-identical
        ("user_id", pa.string()),
        ("org_id", pa.string()),
        ("session_id", pa.string()),
        ("client_version", pa.string()),
        ("privacy_mode", pa.bool_()),
        ("repo", pa.struct([("repo_id", pa.string()), ("commit", pa.string())])),
        ("file", pa.struct([("path", pa.string()), ("language", pa.string())])),
        ("context", pa.struct([("prefix", pa.string()), ("suffix", pa.string())])),
        ("suggestion", pa.string()),
        ("outcome", pa.string()),
        ("accepted_text", pa.string()),
        ("messages", pa.list_(MESSAGE)),
        ("diff", pa.string()),
        ("latency_ms", pa.int64()),
        # provenance added by ingest: where the row came from (for quarantine and lineage)
        ("_source_file", pa.string()),
        ("_source_line", pa.int64()),
    ]
)

SEGMENT = pa.struct([("text", pa.string()), ("train", pa.bool_()), ("role", pa.string())])

RECORD_SOURCE = pa.struct(
    [
        ("event_id", pa.string()),
        ("user_id", pa.string()),
        ("org_id", pa.string()),
        ("session_id", pa.string()),
        ("timestamp", pa.string()),
        ("repo_id", pa.string()),
        ("language", pa.string()),
        ("path", pa.string()),
    ]
)

TRAINING_RECORD_V1 = pa.schema(
    [
        ("doc_id", pa.string()),
        ("kind", pa.string()),
        ("segments", pa.list_(SEGMENT)),
        ("chosen", pa.string()),
        ("rejected", pa.string()),
        ("source", RECORD_SOURCE),
        ("meta", pa.string()),  # a JSON object with sorted keys (stable bytes on every engine)
    ]
)

# What the `kto` stage writes: TRL's unpaired-preference columns (KTOTrainer reads
# prompt, completion, label directly), the reward, and the record's lineage.
KTO_EXAMPLE_V1 = pa.schema(
    [
        ("prompt", pa.string()),
        ("completion", pa.string()),
        ("label", pa.bool_()),
        ("reward", pa.float64()),
        ("doc_id", pa.string()),
        ("source", RECORD_SOURCE),
        ("meta", pa.string()),
    ]
)

# What a raw-line source yields before ingest parses it.
RAW_LINES = pa.schema(
    [
        ("_raw", pa.binary()),
        ("_source_file", pa.string()),
        ("_source_line", pa.int64()),
        ("_read_error", pa.string()),
        # byte offset of the line in the (decompressed) file; null for Parquet rows. With
        # `quarantine: {raw: hash}` it locates a quarantined line without keeping its text.
        ("_offset", pa.int64()),
    ]
)

SCHEMAS: dict[str, pa.Schema] = {
    "editor_event.v1": EDITOR_EVENT_V1,
    "training_record.v1": TRAINING_RECORD_V1,
    "kto_example.v1": KTO_EXAMPLE_V1,
}


def schema_by_name(name: str) -> pa.Schema:
    """Look up a contract by its versioned name, with an error that lists the known ones."""
    try:
        return SCHEMAS[name]
    except KeyError:
        raise KeyError(f"unknown schema {name!r}; known: {sorted(SCHEMAS)}") from None


def load_contract(name: str) -> dict:
    """The JSON contract document for `name` (shipped in the package: datakit/schemas/NAME.json)."""
    return schema_document(name)


# Which fields an editor event must carry (non-null), by event_type: read from the JSON
# contract (schemas/editor_event.v1.json, "required" and "x-required-by-type") so the
# document people read and the validator that runs can never disagree.
def _required() -> tuple[tuple[str, ...], dict[str, tuple[str, ...]]]:
    doc = schema_document("editor_event.v1")
    always = tuple(doc["required"])
    by_type = {t: tuple(f for f in fields if f not in always) for t, fields in doc["x-required-by-type"].items()}
    return always, by_type


REQUIRED_ALWAYS, REQUIRED_BY_TYPE = _required()
