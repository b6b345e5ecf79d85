"""Append-mode outputs: a dataset made of snapshots, one per scheduled run (schemas/output_layout.md).

    OUT/manifest.json              the union: `snapshots` (commit order) + every snapshot's shards
    OUT/README.md                  dataset card naming every data file of every snapshot
    OUT/_SUCCESS
    OUT/_snapshots/<ID>/           one snapshot = one ordinary datakit output folder (its own
                                   manifest, data/, _dropped/, _run.json, _shards/ ...)
    OUT/_snapshots/<ID>/_dedup_state/  what later snapshots deduplicate against (kept docs only)

Why each snapshot is an ordinary output folder: the engines' commit, resume, retract and lock
rules (datakit.io.publish, datakit.io.sinks) apply to it unchanged; this module only adds the
top-level commit that makes the union visible. A reader goes through the top-level manifest, so:

* a new snapshot becomes visible in one atomic write of OUT/manifest.json (after its data and
  dedup state are complete); a crash before that leaves the previous union readable;
* a rerun of an existing snapshot first withdraws it from the union (the others stay readable),
  keeps its position (`seq`) and its history, so it gives the same bytes as the first run.

Order: snapshots are ordered by their first commit (`seq`), not by name. A snapshot's history is
every snapshot committed before it; a backfill (an older day arriving late) therefore
deduplicates against everything already in the dataset and is appended after it (docs/scheduling.md).
"""
from __future__ import annotations

import json
import re
from typing import Any

from datakit.io.atomic import read_json_object, write_json_atomic
from datakit.io.fs import InputError, filesystem, from_cwd
from datakit.io.layout import write_card

SNAPSHOTS_DIR = "_snapshots"
FORGET_DIR = "_forget"  # deletion lists applied to the dataset (datakit.forget_snapshots), kept for later runs
LAYOUT = "snapshots"  # manifest["layout"] of an append-mode dataset
# fields of the dataset itself (not of a run): carried over by every commit
DATASET_FIELDS = ("forget_generation", "forget_lists")
_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=-]{0,127}$")
_PARTITION = re.compile(r"(?:^|/)([A-Za-z_][A-Za-z0-9_]*=[^/*?\[\]]+)(?=/|$)")
_WILD_PARTITION = re.compile(r"(?:^|/)([A-Za-z_][A-Za-z0-9_]*=[^/]*[*?\[][^/]*)(?=/|$)")  # dt=*, dt=2026-11-0?


class SnapshotError(InputError):
    """A snapshot id is missing, cannot be derived, or is not a valid name. Exit 2."""


def check_id(snapshot: str) -> str:
    if not _ID.match(snapshot or ""):
        raise SnapshotError(f"invalid snapshot id {snapshot!r}: use letters, digits and . _ = - (e.g. dt=2026-11-02)")
    return snapshot


def derive_id(paths: list[str]) -> str:
    """The snapshot id from the input's partition folder (`.../dt=2026-11-02/...`): the innermost
    `key=value` folder; every input path must agree. Why: a nightly job reads one partition, and
    naming the snapshot after it makes a retried night rerun the same snapshot."""
    found = set()
    for p in paths:
        parts = _PARTITION.findall(str(p))
        if not parts and (wild := _WILD_PARTITION.search(str(p))):
            raise SnapshotError(f"cannot derive a snapshot id: input {p} spans every partition {wild.group(1)} "
                                "matches; pass --snapshot ID (or name one partition)")
        if not parts:
            raise SnapshotError(f"cannot derive a snapshot id: input {p} has no partition folder like dt=2026-11-02; "
                                "pass --snapshot ID")
        found.add(parts[-1])
    if len(found) != 1:
        raise SnapshotError(f"cannot derive a snapshot id: the inputs span partitions {sorted(found)}; pass --snapshot ID")
    return check_id(found.pop())


def partition_folder(path: str) -> str | None:
    """`path` up to and including its innermost `key=value` folder (None when it has none)."""
    found = list(_PARTITION.finditer(str(path)))
    return str(path)[:found[-1].end()] if found else None


def check_same_partition(out: str, snapshot: str, paths: list[str]) -> None:
    """A derived snapshot id that a committed snapshot already has must come from the same partition folder.

    Why: the id is the innermost `key=value` folder, so under `year=/month=/day=` folders April 29 is
    `day=29`, as March 29 is; found in an operations review, April's night replaced March's day as a
    "redo" (and withdrew the days after it), exit 0 with one warning. A run that reads another folder
    under an existing id is refused; `--snapshot ID` names the snapshot when the layout needs it."""
    try:
        m = read_json_object(f"{snapshot_path(out, snapshot)}/manifest.json") or {}
    except (OSError, ValueError, InputError):
        return
    before = {partition_folder(_absolute(i["path"])) for i in m.get("inputs") or [] if isinstance(i, dict) and i.get("path")}
    now = {partition_folder(_absolute(p)) for p in paths}
    before.discard(None)
    now.discard(None)
    if before and now and not before & now:
        raise SnapshotError(f"snapshot {snapshot} was committed from {sorted(before)[0]}, and this run reads "
                            f"{sorted(now)[0]}: the id derived from the innermost partition folder names both; "
                            "pass --snapshot ID (e.g. built from every level: year=2026_month=04_day=29)")


def _absolute(path: str) -> str:
    """A recorded or given input path as one spelling: links resolved too, because two spellings of one
    partition folder must compare equal here."""
    import os

    return path if "://" in path else os.path.realpath(from_cwd(path))


def snapshot_path(out: str, snapshot: str) -> str:
    return f"{out.rstrip('/')}/{SNAPSHOTS_DIR}/{check_id(snapshot)}"


def read_top(out: str) -> dict[str, Any] | None:
    """The top-level manifest of an append-mode dataset (None when there is none yet)."""
    m = read_json_object(f"{out.rstrip('/')}/manifest.json")  # a damaged one is one line, exit 2
    if m is None:
        return None
    if m.get("layout") != LAYOUT:
        raise InputError(f"{out} holds an overwrite-mode dataset; an append-mode run needs an empty folder or "
                         "an append-mode dataset (use another output path)")
    return m


def _seq_of(top: dict[str, Any] | None, snapshot: str) -> int | None:
    if not top:
        return None
    for s in top.get("snapshots", []) + top.get("withdrawn", []):
        if s["id"] == snapshot:
            return int(s["seq"])
    return None


def history(top: dict[str, Any] | None, snapshot: str) -> list[dict[str, Any]]:
    """The committed snapshots this one deduplicates against: those first committed before it
    (all of them for a new snapshot), in commit order. Never the snapshot itself."""
    if not top:
        return []
    seq = _seq_of(top, snapshot)
    return [s for s in top.get("snapshots", []) if s["id"] != snapshot and (seq is None or s["seq"] < seq)]


def withdraw(out: str, top: dict[str, Any] | None, snapshot: str) -> dict[str, Any] | None:
    """Before rewriting an existing snapshot: commit a top manifest without it (position kept under
    `withdrawn`), so no reader sees its files while they are rewritten. Returns the manifest now in place."""
    if not top or not any(s["id"] == snapshot for s in top.get("snapshots", [])):
        return top
    gone = next(s for s in top["snapshots"] if s["id"] == snapshot)
    rest = [s for s in top["snapshots"] if s["id"] != snapshot]
    withdrawn = [w for w in top.get("withdrawn", []) if w["id"] != snapshot] + [_withdrawn_entry(gone)]
    new = _union(top, rest, withdrawn)
    _commit_top(out, new)
    return new


def _withdrawn_entry(snap: dict[str, Any]) -> dict[str, Any]:
    """What the top manifest keeps of a withdrawn snapshot: its position, and the digest of the dedup state
    it was committed with, so a rerun after a failed attempt still knows what later snapshots were
    deduplicated against (found in an operations review: a redo of an old day, stopped once and retried,
    no longer saw its earlier state, withdrew nothing, and the union held 159 duplicate documents)."""
    entry = {"id": snap["id"], "seq": snap["seq"]}
    if snap.get("dedup_state") is not None:
        entry["dedup_state"] = snap["dedup_state"]
    return entry


def previous_entry(top: dict[str, Any] | None, snapshot: str) -> dict[str, Any] | None:
    """The snapshot's committed entry, else its withdrawn one (a rerun after a failed attempt), else None."""
    for key in ("snapshots", "withdrawn"):
        found = next((s for s in (top or {}).get(key, []) if s["id"] == snapshot), None)
        if found is not None:
            return found
    return None


def withdraw_later(out: str, top: dict[str, Any] | None, seq: int) -> tuple[dict[str, Any] | None, list[str]]:
    """Withdraw every committed snapshot first committed after position `seq` (positions kept, so
    each goes back to its place when rerun); returns the manifest now in place and their ids.

    Why: a later snapshot was deduplicated against the earlier ones as they were. When a redo changes
    an earlier snapshot's documents, the later one's decisions are stale (the union held 450 pairs of
    copies after day 1 was redone with day 2's files; found in review); out of the union until rerun,
    it cannot put a duplicate pair in front of readers.
    """
    if not top:
        return top, []
    later = [s for s in top.get("snapshots", []) if int(s["seq"]) > seq]
    if not later:
        return top, []
    ids = [s["id"] for s in later]
    rest = [s for s in top["snapshots"] if s["id"] not in ids]
    withdrawn = [w for w in top.get("withdrawn", []) if w["id"] not in ids] + [_withdrawn_entry(s) for s in later]
    new = _union(top, rest, withdrawn)
    _commit_top(out, new)
    return new, ids


def check_order(top: dict[str, Any] | None, snapshot: str) -> None:
    """Refuse to run `snapshot` while a snapshot before it (by position; every one, for a new snapshot)
    is withdrawn: its history would lack that snapshot, and putting it back later could bring
    duplicates of this one into the union. Rerunning the withdrawn ones first, in order, restores it."""
    if not top:
        return
    seq = _seq_of(top, snapshot)
    pending = [w for w in top.get("withdrawn", []) if w["id"] != snapshot and (seq is None or int(w["seq"]) < seq)]
    if pending:
        names = ", ".join(w["id"] for w in sorted(pending, key=lambda w: w["seq"]))
        raise SnapshotError(f"snapshot {snapshot} must wait: the earlier snapshot(s) {names} are withdrawn from the "
                            "dataset (a redo changed what they deduplicate against, or a rerun of them did not "
                            "finish); rerun them first, in this order, with the same --snapshot ids")


# what a token dataset's readers take from its one manifest for every shard: a snapshot that differs
# in any of them cannot join the union (its ids would be read with another tokenizer, its rows with
# another length)
# (the token dtype and pad id follow from the tokenizer and the format; each format records them its own way:
# mds always int32, megatron no pad id)
TOKEN_LAYOUT = ("format", "seq_len", "tokenizer sha256")


def token_layout(format: str, seq_len: Any, sha256: Any) -> dict[str, Any]:
    """The fields of TOKEN_LAYOUT, as `check_same_tokens` compares them."""
    return dict(zip(TOKEN_LAYOUT, (format, seq_len, sha256)))


def check_same_tokens(out: str, top: dict[str, Any] | None, snapshot: str, mine: dict[str, Any] | None) -> None:
    """A `SnapshotError` before any work when this run's token layout (`token_layout`: format, seq_len,
    tokenizer sha256) differs from the committed snapshots'.

    Why: found in review, a day appended with another tokenizer committed with exit 0, and the union's
    one manifest then named only the new tokenizer: every earlier day's ids decoded to garbage with it;
    a day with another seq_len left the whole dataset unreadable (the loader refused every older shard).
    Record formats (parquet, jsonl) have no token layout (`mine` None) and are not checked."""
    others = [s for s in (top or {}).get("snapshots", []) if s["id"] != snapshot]
    if mine is None or not others:
        return
    first = min(others, key=lambda s: s["seq"])
    fs, p = filesystem(f"{out.rstrip('/')}/{first['path']}/manifest.json")
    m = json.loads(fs.cat_file(p))
    theirs = token_layout(m.get("format"), m.get("seq_len"), (m.get("tokenizer") or {}).get("sha256"))
    diff = [f"{k} {theirs[k]!r} there, {mine[k]!r} here" for k in TOKEN_LAYOUT if theirs[k] != mine[k]]
    if diff:
        raise SnapshotError(
            f"{out}: snapshot {snapshot} cannot join this dataset: its committed snapshots ({first['id']} first) "
            f"were written with another token layout ({'; '.join(diff)}); write it to a new dataset, or rewrite "
            "every snapshot with the new settings")


def _prefixed(shard: dict[str, Any], prefix: str) -> dict[str, Any]:
    """A snapshot's shard entry with its file names made relative to the dataset root."""
    s = dict(shard)
    for k in ("files", "data_prefixes"):
        if k in s:
            s[k] = [f"{prefix}/{f}" for f in s[k]]
    for k in ("sha256", "bytes"):
        if k in s:
            s[k] = {f"{prefix}/{f}": v for f, v in s[k].items()}
    if "arrays" in s:
        s["arrays"] = {k: f"{prefix}/{v}" for k, v in s["arrays"].items()}
    return s


def _base(out: str, snaps: list[dict[str, Any]], snapshot: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The top manifest's descriptive fields (format, pipeline, environment, inputs): those of the
    latest snapshot in commit order, so a rerun of an older snapshot leaves them (and the bytes) as they were."""
    last = max(snaps, key=lambda s: s["seq"])
    if last["id"] != snapshot:
        fs, p = filesystem(f"{out.rstrip('/')}/{last['path']}/manifest.json")
        manifest = json.loads(fs.cat_file(p))
    base = {k: v for k, v in manifest.items()
            if k not in ("shards", "rows", "data_prefixes", "loss_mask_prefixes", "dataset_files")}
    tok = base.get("tokenizer")
    if isinstance(tok, dict) and tok.get("file"):  # the effective tokenizer.json sits in the snapshot's folder
        base["tokenizer"] = {**tok, "file": f"{last['path']}/{tok['file']}"}
    return base


def _union(base: dict[str, Any], snaps: list[dict[str, Any]], withdrawn: list[dict[str, Any]]) -> dict[str, Any]:
    """The top manifest for `snaps` (commit order): every snapshot's shards renumbered in order."""
    snaps = sorted(snaps, key=lambda s: s["seq"])
    shards: list[dict[str, Any]] = []
    for s in snaps:
        for sh in s["shards"]:
            shards.append({**sh, "shard": len(shards), "snapshot": s["id"]})
    body = {k: v for k, v in base.items() if k not in ("snapshots", "withdrawn", "shards", "rows")}
    body.update({"layout": LAYOUT, "snapshots": snaps, "withdrawn": sorted(withdrawn, key=lambda w: w["seq"]),
                 "shards": shards, "rows": int(sum(s["rows"] for s in snaps))})
    if isinstance(base.get("totals"), dict):
        body["totals"] = _union_totals(base["totals"], shards, base.get("seq_len"))
    # files that describe a snapshot's whole data (MDS: its data/index.json), each under its snapshot's path
    # (found in review: the top manifest listed the latest snapshot's `data/index.json` as if at the root,
    # which does not exist there, so `datakit validate` and `inspect --verify` of every such dataset failed)
    extra = [s["dataset_files"] for s in snaps if s.get("dataset_files")]
    if extra:
        body["dataset_files"] = {k: ([f for e in extra for f in e.get(k, [])] if k == "files" else
                                     {f: v for e in extra for f, v in (e.get(k) or {}).items()})
                                 for k in sorted({k for e in extra for k in e})}
    return body


def _union_totals(latest: dict[str, Any], shards: list[dict[str, Any]], seq_len: Any) -> dict[str, Any]:
    """A token format's `totals` over every snapshot: each count is the sum of the shard entries'
    (the writers compute their totals the same way), fill rate recomputed. Without this the top
    manifest carried the latest snapshot's totals, and `inspect`/loaders reported one day as the dataset."""
    totals = {k: int(sum(int(sh.get(k, 0)) for sh in shards)) for k in latest if k != "fill_rate"}
    if "fill_rate" in latest:
        seqs = totals.get("sequences", 0)
        totals["fill_rate"] = round(totals.get("tokens", 0) / (seqs * int(seq_len)), 6) if seqs and seq_len else 0.0
    return totals


def _commit_top(out: str, body: dict[str, Any]) -> None:
    """Card, manifest, `_SUCCESS` of the dataset, as one step a SIGTERM waits for; only while this run still
    holds the dataset's lock (`publish.check_still_held`). Why held: found in an operations review, a SIGTERM
    between the card and the manifest left a card naming the new day's files beside the old manifest."""
    from datakit.interrupts import held_until_done
    from datakit.io.publish import check_still_held

    out = out.rstrip("/")
    check_still_held(out)
    fs, p = filesystem(f"{out}/_SUCCESS")
    with held_until_done("committing the dataset's manifest"):
        if fs.exists(p):
            fs.rm(p)
        write_card(out, body)
        write_json_atomic(f"{out}/manifest.json", body)
        with fs.open(p, "wb") as f:
            f.write(b"")


def commit(out: str, top: dict[str, Any] | None, snapshot: str, manifest: dict[str, Any],
           state: dict[str, Any] | None) -> dict[str, Any]:
    """Add (or put back) a committed snapshot to the union: one atomic write of OUT/manifest.json."""
    seq = _seq_of(top, snapshot)
    if seq is None:
        seqs = [int(s["seq"]) for s in (top or {}).get("snapshots", []) + (top or {}).get("withdrawn", [])]
        seq = max(seqs, default=-1) + 1
    prefix = f"{SNAPSHOTS_DIR}/{snapshot}"
    entry = {"id": snapshot, "seq": seq, "path": prefix, "rows": int(manifest["rows"]),
             "pipeline_hash": manifest.get("pipeline_hash"),
             "shards": [_prefixed(sh, prefix) for sh in manifest["shards"]]}
    if manifest.get("data_prefixes") is not None:
        entry["data_prefixes"] = [f"{prefix}/{p}" for p in manifest["data_prefixes"]]
        # aligned with data_prefixes (null: no mask file); a snapshot written before the list existed has none
        masks = manifest.get("loss_mask_prefixes") or [None] * len(manifest["data_prefixes"])
        entry["loss_mask_prefixes"] = [f"{prefix}/{p}" if p else None for p in masks]
    if manifest.get("dataset_files"):
        entry["dataset_files"] = _prefixed(manifest["dataset_files"], prefix)
    if state is not None:
        entry["dedup_state"] = {**state, "files": {k: f"{prefix}/{v}" for k, v in state["files"].items()}}
    snaps = [s for s in (top or {}).get("snapshots", []) if s["id"] != snapshot] + [entry]
    withdrawn = [w for w in (top or {}).get("withdrawn", []) if w["id"] != snapshot]
    body = _union(_base(out, snaps, snapshot, manifest), snaps, withdrawn)
    body.update({k: top[k] for k in DATASET_FIELDS if top and k in top})
    if manifest.get("data_prefixes") is not None:  # megatron: every snapshot's prefixes, in order
        body["data_prefixes"] = [p for s in body["snapshots"] for p in s.get("data_prefixes", [])]
        body["loss_mask_prefixes"] = [p for s in body["snapshots"]
                                      for p in s.get("loss_mask_prefixes", [None] * len(s.get("data_prefixes", [])))]
    _commit_top(out, body)
    remove_superseded(out, body)
    return body


def remove_superseded(out: str, top: dict[str, Any] | None) -> list[str]:
    """Delete every version of a committed snapshot that the manifest `top` does not point at: the
    `<ID>` folder a forget replaced by `<ID>~forget-N`, or an older `~forget-M`. Returns their names.

    Why every snapshot's, at every commit and at the start of a forget: such a folder holds records no
    manifest lists, possibly the very rows a deletion request removed. A forget killed after its commit
    left them all (found in review: 120 rows of a deleted user, which the documented glob read), and
    its retry found nothing to do, exit 0; the next night's commit swept only its own snapshot's.
    Called with the writer lock held. Folders of ids the manifest does not list (a killed run's
    snapshot, kept for its resume; a withdrawn one, its own rule) are left alone."""
    fs, p = filesystem(f"{out.rstrip('/')}/{SNAPSHOTS_DIR}")
    try:
        names = [f.rstrip("/").rsplit("/", 1)[-1] for f in fs.ls(p, detail=False)]
    except FileNotFoundError:
        return []
    current = {s["id"]: s["path"] for s in (top or {}).get("snapshots", [])}
    gone = []
    for n in names:
        sid = n.split("~", 1)[0]
        if sid in current and f"{SNAPSHOTS_DIR}/{n}" != current[sid]:
            fs.rm(f"{p.rstrip('/')}/{n}", recursive=True)
            gone.append(n)
    return gone


def remove_uncommitted(out: str, top: dict[str, Any] | None) -> list[str]:
    """Delete the snapshot folders of ids the manifest neither lists nor withdrew (a killed night's, kept for
    its resume); returns their names. For `forget`: such a folder holds the night's records and raw spills,
    possibly of the users a deletion list names, which no forget read (found in an operations review: 138
    rows of a deleted user stayed in one until the night was rerun). The rerun starts over, with the list."""
    fs, p = filesystem(f"{out.rstrip('/')}/{SNAPSHOTS_DIR}")
    try:
        names = [f.rstrip("/").rsplit("/", 1)[-1] for f in fs.ls(p, detail=False)]
    except FileNotFoundError:
        return []
    known = {s["id"] for key in ("snapshots", "withdrawn") for s in (top or {}).get(key, [])}
    gone = [n for n in names if n.split("~", 1)[0] not in known]
    for n in gone:
        fs.rm(f"{p.rstrip('/')}/{n}", recursive=True)
    return gone


def forget_lists(out: str, top: dict[str, Any] | None) -> list[str]:
    """Absolute paths of the deletion lists applied to the dataset (every later run applies them too)."""
    return [f"{out.rstrip('/')}/{f}" for f in (top or {}).get("forget_lists", [])]


def member_paths(path: str) -> list[str]:
    """An append-mode dataset as its committed snapshot folders (snapshot order); any other path as itself.

    Why: each snapshot carries its own n-gram index (`output.index: true` indexes the snapshot a run
    writes), so the dataset's index is extended by one snapshot per run instead of being rebuilt,
    and a contamination check of the dataset reads every snapshot's index."""
    try:
        fs, p = filesystem(f"{str(path).rstrip('/')}/manifest.json")
        if any(c in str(path) for c in "*?[") or not fs.exists(p):
            return [path]
        m = json.loads(fs.cat_file(p))
    except (OSError, ValueError):
        return [path]
    if not isinstance(m, dict) or m.get("layout") != LAYOUT:  # (a damaged one: `verify_if_committed` says so)
        return [path]
    return [f"{str(path).rstrip('/')}/{s['path']}" for s in m.get("snapshots", [])]


def select(top: dict[str, Any], snapshot: str) -> dict[str, Any]:
    """The top manifest narrowed to one snapshot's shards (for `read_output(path, snapshot=ID)`)."""
    if not any(s["id"] == snapshot for s in top.get("snapshots", [])):
        known = ", ".join(s["id"] for s in top.get("snapshots", [])) or "none"
        raise InputError(f"no snapshot {snapshot!r} in the dataset (committed: {known})")
    shards = [sh for sh in top["shards"] if sh.get("snapshot") == snapshot]
    return {**top, "shards": shards, "rows": int(sum(sh["rows"] for sh in shards))}
