"""The extraction rules: one editor event (a dict) -> training records (dicts), or a reason why none.

Kept apart from the stage so each rule can be read, tested and changed on
hand-written events without any engine. Conventions of the events are those of
`schemas/editor_event.v1.json`; the records are `training_record.v1`.

Rules (the `kinds` an extract stage may select):

- `code`: the file after the user's action. Accepted tab completion:
  `prefix + accepted text + suffix` (accepted text = `accepted_text`, or the
  suggestion when that is missing). Accepted inline edit / agent step with a
  `context`: `diff` applied to `prefix + suffix`. One trainable segment, role
  `code`. A *partial* acceptance gives no code record: the file is then a
  transient state in the middle of typing (often not even valid syntax), and
  pretraining on it would teach broken code; its signal goes to `fim`.
- `fim`: accepted or partial tab completion -> segments prefix / suffix (context,
  not trained) and middle (the accepted text, trained), language and path in meta.
- `sft`: chat turn / agent step -> one segment per message; only assistant
  messages (answers and tool calls) are trained; system, user and tool output are
  context. A tool call is rendered as `{"arguments": ..., "name": ...}` JSON.
  Trailing non-assistant messages are cut (they teach nothing). A response the
  user rejected (`outcome = rejected`) is not trained on.
- `preference`: in one session, tab completions at the same context (path,
  prefix, suffix): the accepted suggestion is `chosen`, a rejected one `rejected`,
  the prefix the prompt. Pairing is global (an aggregate + join in the stage); the
  pair is emitted by the accepted event, the rejected one's id is in meta. A pair
  with an empty prompt (`no_example:empty_prompt`) or a whitespace-only side
  (`no_example:blank_completion`) is dropped; whitespace-only chat messages are skipped.

An event yielding nothing gets a reason `no_example:<why>`.
"""
from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from datakit.contracts import doc_id  # the record id rule of training_record.v1 (also used by synth)
from datakit.stages.json_depth import json_too_deep

SEP = "\x1f"  # joins ids inside hashed keys and aggregate payloads (never appears in ids)


class DiffError(ValueError):
    """A unified diff does not apply to the text it claims to change."""


def context_key(session_id: str | None, path: str | None, prefix: str | None, suffix: str | None) -> str:
    """Identity of "the same cursor in the same file state" within a session (preference pairing).

    The parts are JSON-encoded, not joined by SEP: a path or a file's text may hold any character, and a
    `\x1f` in one shifted the boundaries, so events of different sessions or files paired (found in review)."""
    blob = json.dumps([session_id or "", path or "", prefix or "", suffix or ""], ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def lines_keepends(text: str) -> list[str]:
    """Split on "\\n" only (unlike str.splitlines, form feeds and \\u2028 stay inside a line)."""
    out = text.split("\n")
    lines = [ln + "\n" for ln in out[:-1]]
    if out[-1]:
        lines.append(out[-1])
    return lines


_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def apply_unified_diff(base: str, diff: str) -> str:
    """Apply a single-file unified diff to `base`, strictly (every context and removed line must match).

    One tolerance: a file whose every line ends in CRLF, with a diff that has no CR at all (an
    editor's text model keeps lines without their ends and joins a diff with "\n"), is patched
    line for line, and the added lines get the file's CRLF (a pure insertion too, which would
    otherwise apply and leave the file with mixed line ends). Every such edit from a Windows
    checkout was dropped as `diff_does_not_apply` (found in a hostile-input review). A file of
    mixed line ends is not guessed at: it must match byte for byte.

    Why hand-written: the patch libraries on PyPI are unmaintained or work on
    files; this is 50 lines, checked against `difflib` round trips in the tests.
    """
    return _apply(base, diff, "\r\n" if "\r" not in diff and _all_crlf(base) else "\n")


def _all_crlf(text: str) -> bool:
    """Every line end of `text` is CRLF (and there is at least one)."""
    n = text.count("\n")
    return n > 0 and text.count("\r\n") == n


def _apply(base: str, diff: str, eol: str) -> str:
    """`apply_unified_diff` with the diff's lines ending in `eol` (where a line has an end)."""
    src = lines_keepends(base)
    out: list[str] = []
    pos = 0  # next unread index in src
    lines = diff.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    i, hunks, headers = 0, 0, 0
    while i < len(lines):
        line = lines[i]
        m = _HUNK.match(line)
        if not m:
            if line.startswith("--- "):
                headers += 1
                if headers > 1:
                    raise DiffError("diff touches more than one file")
            elif hunks and line.strip():
                raise DiffError(f"unexpected line {i + 1} outside a hunk")
            i += 1
            continue
        hunks += 1
        old_start, old_len = int(m.group(1)), int(m.group(2) if m.group(2) is not None else 1)
        new_len = int(m.group(4) if m.group(4) is not None else 1)
        start = old_start - 1 if old_len else old_start  # "-0,0" inserts at the top; "-5,0" after line 5
        if start < pos or start > len(src):
            raise DiffError(f"hunk {hunks} starts outside the text")
        out.extend(src[pos:start])
        pos = start
        i += 1
        seen_old = seen_new = 0
        while i < len(lines) and (seen_old < old_len or seen_new < new_len):
            body = lines[i]
            op, text = (body[:1], body[1:]) if body else (" ", "")
            no_newline = i + 1 < len(lines) and lines[i + 1].startswith("\\ ")
            full = text if no_newline else text + eol
            if op in (" ", "-"):
                if pos >= len(src) or src[pos] != full:
                    raise DiffError(f"hunk {hunks} does not match the text at line {pos + 1}")
                pos += 1
                seen_old += 1
                if op == " ":
                    out.append(full)
                    seen_new += 1
            elif op == "+":
                out.append(full)
                seen_new += 1
            else:
                raise DiffError(f"bad line in hunk {hunks}")
            i += 2 if no_newline else 1
        if seen_old != old_len or seen_new != new_len:
            raise DiffError(f"hunk {hunks} is truncated")
    if not hunks:
        if diff.strip():
            raise DiffError("diff has no hunks")
        return base  # an empty diff changes nothing
    out.extend(src[pos:])
    return "".join(out)


def _source(e: dict[str, Any]) -> dict[str, Any]:
    repo, file = e.get("repo") or {}, e.get("file") or {}
    return {"event_id": e.get("event_id"), "user_id": e.get("user_id"), "org_id": e.get("org_id"),
            "session_id": e.get("session_id"), "timestamp": e.get("timestamp"), "repo_id": repo.get("repo_id"),
            "language": file.get("language"), "path": file.get("path")}


def _meta(**kw: Any) -> str:
    return json.dumps({k: v for k, v in kw.items() if v is not None}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _record(e: dict, kind: str, segments: list[dict], meta: dict, *, chosen: str | None = None,
            rejected: str | None = None, key: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"doc_id": doc_id(e["event_id"], kind, *key), "kind": kind, "segments": segments, "chosen": chosen,
            "rejected": rejected, "source": _source(e), "meta": _meta(**meta)}


def accepted_text(e: dict) -> str | None:
    """What the user kept of a completion: `accepted_text`, else the suggestion if fully accepted."""
    if e.get("outcome") == "accepted":
        return e.get("accepted_text") if e.get("accepted_text") is not None else e.get("suggestion")
    if e.get("outcome") == "partial":
        return e.get("accepted_text")
    return None


def _ctx(e: dict) -> tuple[str, str]:
    c = e.get("context") or {}
    return c.get("prefix") or "", c.get("suffix") or ""


def code_records(e: dict) -> tuple[list[dict], str | None]:
    et, outcome = e.get("event_type"), e.get("outcome")
    file = e.get("file") or {}
    meta = {"event_type": et, "outcome": outcome, "language": file.get("language"), "path": file.get("path"),
            "commit": (e.get("repo") or {}).get("commit")}  # repository packing groups by (repo_id, commit)
    if et == "tab_completion":
        kept = accepted_text(e) if outcome == "accepted" else None
        if kept is None:
            return [], f"no_example:{outcome or 'no_outcome'}"
        prefix, suffix = _ctx(e)
        if "\r" not in kept and _all_crlf(prefix + suffix):
            # the file's own line ends, as the editor inserts the text, and as an inline edit's diff gets them
            # (found in review: a completion's lines kept "\n" inside a CRLF file, a file of mixed line ends)
            kept = kept.replace("\n", "\r\n")
        text = prefix + kept + suffix
    elif et in ("inline_edit", "agent_step"):
        if outcome != "accepted":
            return [], f"no_example:{outcome or 'no_outcome'}"
        if e.get("context") is None:
            return [], "no_example:no_file_context"
        prefix, suffix = _ctx(e)
        try:
            text = apply_unified_diff(prefix + suffix, e.get("diff") or "")
        except DiffError:
            return [], "no_example:diff_does_not_apply"
        if text == prefix + suffix:  # no diff, or hunks that change nothing: the file before, not an edit
            return [], "no_example:diff_changes_nothing"
    else:
        return [], "no_example:not_code"
    if not text.strip():
        return [], "no_example:empty"
    return [_record(e, "code", [{"text": text, "train": True, "role": "code"}], meta)], None


def fim_records(e: dict) -> tuple[list[dict], str | None]:
    if e.get("event_type") != "tab_completion":
        return [], "no_example:not_completion"
    middle = accepted_text(e)
    if middle is None:
        return [], f"no_example:{e.get('outcome') or 'no_outcome'}"
    if not middle:
        return [], "no_example:empty"
    prefix, suffix = _ctx(e)
    file = e.get("file") or {}
    segs = [{"text": prefix, "train": False, "role": "prefix"}, {"text": suffix, "train": False, "role": "suffix"},
            {"text": middle, "train": True, "role": "middle"}]
    meta = {"language": file.get("language"), "path": file.get("path"), "outcome": e.get("outcome"),
            "partial": e.get("outcome") == "partial"}
    return [_record(e, "fim", segs, meta)], None


def _tool_call_text(name: str, content: str | None) -> str:
    """`{"arguments": ..., "name": ...}`: the arguments parsed when they are JSON, else their text.

    Arguments that parse but cannot be written back as text are kept as their text too: found in
    review, `"\\ud800"` (a lone surrogate escape: a JS client's cut emoji) parsed into a string no UTF-8
    can hold, and nesting deeper than the parser goes raised RecursionError; either failed the extract
    stage and the whole run (exit 3), where one event must cost at most its own record."""
    try:
        # too deep by the text, not by RecursionError, whose depth depends on the stack (the engine): found
        # in review, arguments nested ~950 deep were parsed on Spark and kept as text on the local engine
        if content and json_too_deep(content):
            raise ValueError("nesting too deep")
        args: Any = json.loads(content) if content else None
        text = json.dumps({"arguments": args, "name": name}, sort_keys=True, ensure_ascii=False)
        text.encode("utf-8")  # a lone surrogate raises here, not at the record's write
        return text
    except (ValueError, RecursionError):  # (UnicodeEncodeError is a ValueError)
        return json.dumps({"arguments": content, "name": name}, sort_keys=True, ensure_ascii=False)


def sft_records(e: dict) -> tuple[list[dict], str | None]:
    et = e.get("event_type")
    if et not in ("chat_turn", "agent_step"):
        return [], "no_example:not_conversation"
    if e.get("outcome") == "rejected":
        return [], "no_example:rejected"
    segs: list[dict] = []
    tools: list[str | None] = []
    for m in e.get("messages") or []:
        if not m:
            continue
        role, content, tool = m.get("role") or "user", m.get("content"), m.get("tool_name")
        if role == "assistant" and tool:
            text = _tool_call_text(tool, content)
        else:
            text = content or ""
        # whitespace-only turns teach nothing (and would be trained on); a tool's empty output is kept: it is
        # the result its call got, and without it the next call followed the last as if no result came back
        # (found in review: `mkdir` then `ls` of an empty folder, both results gone, the answer trained on)
        if not text.strip() and role != "tool":
            continue
        segs.append({"text": text, "train": role == "assistant", "role": role})
        tools.append(tool)
    while segs and segs[-1]["role"] != "assistant":
        segs.pop()
        tools.pop()
    if not segs:
        return [], "no_example:no_assistant_turn"
    file = e.get("file") or {}
    meta = {"event_type": et, "language": file.get("language"), "path": file.get("path"),
            "tool_names": tools if any(tools) else None, "turns": sum(1 for s in segs if s["role"] == "assistant")}
    return [_record(e, "sft", segs, meta)], None


# ------------------------------------------------------------------ preference

def preference_candidate(e: dict) -> tuple[str | None, str | None, str | None]:
    """(context key, accepted payload, rejected payload) of an event; Nones if it cannot be in a pair.

    Payloads start with the event id so `min` over them picks the smallest id
    (deterministic pairing) and carry the suggestion text to the other side.
    """
    if e.get("event_type") != "tab_completion" or e.get("outcome") not in ("accepted", "rejected"):
        return None, None, None
    text = accepted_text(e) if e["outcome"] == "accepted" else e.get("suggestion")
    if not text or not text.strip():
        # a blank side is never a candidate, so `min` picks among the usable ones (found in review: a blank
        # rejected suggestion with the smallest id was picked, and the pair with a real one was lost)
        return None, None, None
    prefix, suffix = _ctx(e)
    key = context_key(e.get("session_id"), (e.get("file") or {}).get("path"), prefix, suffix)
    payload = e["event_id"] + SEP + text
    return (key, payload, None) if e["outcome"] == "accepted" else (key, None, payload)


def preference_records(e: dict, pair_acc: str | None, pair_rej: str | None) -> tuple[list[dict], str | None]:
    """The pair record, emitted by the accepted event chosen for its context (if a rejected one exists)."""
    key, mine, _ = preference_candidate(e)
    if key is None:
        return [], "no_example:no_preference_candidate"
    if mine is None:
        return [], "no_example:rejected"  # a rejected suggestion is only ever the other side of a pair
    if pair_acc != mine:
        return [], "no_example:context_already_paired"
    if pair_rej is None:
        return [], "no_example:no_rejected_alternative"
    rej_id, _, rejected = pair_rej.partition(SEP)
    chosen = mine.partition(SEP)[2]
    prefix, suffix = _ctx(e)
    if not prefix.strip():
        return [], "no_example:empty_prompt"  # nothing to condition on: the pair teaches no preference
    if not chosen.strip() or not rejected.strip():
        return [], "no_example:blank_completion"
    if chosen == rejected:  # the same text accepted once and rejected once: no preference to learn
        return [], "no_example:same_completion"
    file = e.get("file") or {}
    meta = {"rejected_event_id": rej_id, "event_ids": sorted([e["event_id"], rej_id]), "language": file.get("language"),
            "path": file.get("path"), "suffix_chars": len(suffix)}
    segs = [{"text": prefix, "train": False, "role": "prompt"}]
    return [_record(e, "preference", segs, meta, chosen=chosen, rejected=rejected, key=(rej_id,))], None


RULES = {"code": code_records, "fim": fim_records, "sft": sft_records}


def extract_event(e: dict, kinds: tuple[str, ...], pair_acc: str | None = None,
                  pair_rej: str | None = None) -> tuple[list[dict], str | None]:
    """All records of one event for the selected kinds, or ([], "no_example:<why>").

    When several kinds yield nothing, the reason of the first selected kind that
    applies to the event's type is reported (e.g. a rejected completion under
    kinds [code, sft] reports `no_example:rejected`, not `not_conversation`).
    """
    records: list[dict] = []
    reasons: list[str] = []
    for kind in kinds:
        if kind == "preference":
            got, why = preference_records(e, pair_acc, pair_rej)
        else:
            got, why = RULES[kind](e)
        records += got
        if why:
            reasons.append(why)
    if records:
        return records, None
    specific = [r for r in reasons if not r.startswith(("no_example:not_", "no_example:no_preference"))]
    return [], (specific or reasons or ["no_example:no_kind"])[0]
