"""`datakit diff A B`: how two outputs differ, for matched-baseline comparisons.

Why these parts: a researcher comparing two training runs needs (1) what changed
in the pipeline, (2) where rows went differently (per-stage counts and drop
reasons), (3) which documents are in one and not the other, (4) how the token
mix moved (per kind and language), and (5) one honest verdict. The verdict
"same data" is given only when every data file's sha256 (from the manifests,
which the writers compute over the bytes) is identical; anything else is
"data differs", even when all counts agree. A manifest only describes its
files, so both sides are checked against their manifests first: every data
file present with its recorded size (one stat each), and when the recorded
sha256 of the two sides agree, every file hashed (both datasets read once) so
that "same data" is said of the bytes on disk. A side that fails is an error,
"cannot compare" (found in a hostile-input review: a missing, truncated or
changed data file of B said "same data", exit 0).

Documents are compared by their key (`doc_id`, or `event_id` for event
outputs) one shard pair at a time when both outputs use the same shard count
(rows are placed by `xxh64(key) % shards`, so a key can only be in the same
shard of both): memory holds one shard's keys. Otherwise all keys are read.
"""
from __future__ import annotations

import html
import json
from typing import Any

MAX_LISTED = 50  # document ids listed per side (all are counted)


def _load(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    from datakit.io.atomic import read_json_object

    base = path.rstrip("/")
    manifest = read_json_object(f"{base}/manifest.json")  # not an object: DamagedJSONError, one line
    if manifest is None:
        raise FileNotFoundError(f"{base}: no manifest.json (not a committed datakit output)")
    return manifest, read_json_object(f"{base}/_run.json") or {}


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted paths of a pipeline config; stages are addressed by name (`stages[dedup].minhash.threshold`)."""
    out: dict[str, Any] = {}
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "stages" and isinstance(v, list) and not prefix:
                seen: dict[str, int] = {}
                for st in v:
                    kind = st.get("kind", "?") if isinstance(st, dict) else "?"
                    seen[kind] = seen.get(kind, 0) + 1
                    name = kind if seen[kind] == 1 else f"{kind}_{seen[kind]}"
                    out.update(_flatten(st, f"stages[{name}]."))
            else:
                out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix.rstrip(".")] = obj
    return out


def config_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """Changed, added and removed settings (the output path is where, not what: left out)."""
    fa, fb = _flatten(a), _flatten(b)
    out = []
    for k in sorted(set(fa) | set(fb)):
        if k == "output.path":
            continue
        # a null on one side that the other side sets to an object: its fields are listed as added (or
        # removed), the null itself is not a change of its own (found in review: "minhash: removed (null)")
        other = fb if k not in fb else fa if k not in fa else None
        if other is not None and (fa.get(k) if k in fa else fb.get(k)) is None \
                and any(p.startswith(k + ".") for p in other):
            continue
        if k not in fb:
            out.append({"path": k, "change": "removed", "a": fa[k]})
        elif k not in fa:
            out.append({"path": k, "change": "added", "b": fb[k]})
        elif fa[k] != fb[k]:
            out.append({"path": k, "change": "changed", "a": fa[k], "b": fb[k]})
    return out


def stage_deltas(ra: dict[str, Any], rb: dict[str, Any]) -> list[dict[str, Any]]:
    sa = {s["name"]: s for s in ra.get("stages", [])}
    sb = {s["name"]: s for s in rb.get("stages", [])}
    names = [s["name"] for s in ra.get("stages", [])] + [n for n in sb if n not in sa]
    out = []
    for n in names:
        a, b = sa.get(n, {}), sb.get(n, {})
        d: dict[str, Any] = {"stage": n, "in": "both" if a and b else ("a" if a else "b")}
        for key in ("rows_in", "rows_out", "emitted"):
            if key in a or key in b:
                d[key] = {"a": a.get(key, 0), "b": b.get(key, 0), "delta": b.get(key, 0) - a.get(key, 0)}
        reasons = sorted(set(a.get("dropped", {})) | set(b.get("dropped", {})))
        d["dropped"] = {r: {"a": a.get("dropped", {}).get(r, 0), "b": b.get("dropped", {}).get(r, 0),
                            "delta": b.get("dropped", {}).get(r, 0) - a.get("dropped", {}).get(r, 0)}
                        for r in reasons}
        out.append(d)
    return out


def _key_files(path: str, manifest: dict[str, Any]) -> tuple[str, list[list[str]]]:
    """The key column and, per shard, the files holding it (Parquet records or packed docs tables)."""
    base = path.rstrip("/")
    fmt = manifest.get("format")
    out_cfg = (manifest.get("pipeline") or {}).get("output") or {}
    key = out_cfg.get("key") or "doc_id"
    shards = []
    for s in manifest.get("shards", []):
        if fmt == "packed":
            files = [s["arrays"]["docs"]] if "arrays" in s else [f for f in s["files"] if f.startswith("docs-")]
            files += [s["preference_file"]] if s.get("preference_file") else []
        else:
            files = [f for f in s["files"] if f.endswith(".parquet")]
        shards.append([f"{base}/{f}" for f in files])
    return key, shards


def _keys(files: list[str], key: str, used: list[str] | None = None) -> set[str]:
    import pyarrow.parquet as pq

    from datakit.io.fs import arrow_filesystem, filesystem

    out: set[str] = set()
    for url in files:
        fs, p = filesystem(url)
        f = pq.ParquetFile(p, filesystem=arrow_filesystem(fs))
        names = f.schema_arrow.names
        col = next((c for c in (key, "doc_id", "event_id") if c in names), None)  # records, or events outputs
        if col is None:
            continue
        if used is not None and col not in used:
            used.append(col)
        for b in f.iter_batches(columns=[col], batch_size=65536):
            out.update(v for v in b.column(0).to_pylist() if v is not None)
    return out


def document_diff(pa_: str, ma: dict[str, Any], pb: str, mb: dict[str, Any]) -> dict[str, Any]:
    ka, sa = _key_files(pa_, ma)
    kb, sb = _key_files(pb, mb)
    pairs = list(zip(sa, sb)) if len(sa) == len(sb) else [([f for s in sa for f in s], [f for s in sb for f in s])]
    added: list[str] = []
    removed: list[str] = []
    n_added = n_removed = n_common = 0
    used: list[str] = []
    for fa, fb in pairs:
        a, b = _keys(fa, ka, used), _keys(fb, kb, used)
        plus, minus = b - a, a - b
        n_added += len(plus)
        n_removed += len(minus)
        n_common += len(a & b)
        added = sorted(added + sorted(plus)[:MAX_LISTED])[:MAX_LISTED]
        removed = sorted(removed + sorted(minus)[:MAX_LISTED])[:MAX_LISTED]
    return {"key": used[0] if used else ka, "added": n_added, "removed": n_removed, "common": n_common,
            "added_ids": added, "removed_ids": removed, "shard_by_shard": len(sa) == len(sb)}


def _token_mix(run: dict[str, Any]) -> tuple[str, dict[str, int]]:
    for what in ("token_sum", "docs"):
        for s in reversed(run.get("stages", [])):
            if what in s.get("profile", {}):
                return ("tokens" if what == "token_sum" else "documents"), s["profile"][what]
    return "documents", {}


def token_deltas(ra: dict[str, Any], rb: dict[str, Any]) -> dict[str, Any]:
    unit_a, a = _token_mix(ra)
    unit_b, b = _token_mix(rb)
    unit = unit_a if unit_a == unit_b else "documents"
    if unit_a != unit_b:  # one side tokenized, the other not: compare documents
        a = next((s["profile"]["docs"] for s in reversed(ra.get("stages", [])) if "docs" in s.get("profile", {})), {})
        b = next((s["profile"]["docs"] for s in reversed(rb.get("stages", [])) if "docs" in s.get("profile", {})), {})
    groups = sorted(set(a) | set(b))
    rows = [{"kind": g.split("|")[0], "language": g.split("|")[1], "a": a.get(g, 0), "b": b.get(g, 0),
             "delta": b.get(g, 0) - a.get(g, 0)} for g in groups]
    return {"unit": unit, "groups": rows, "total": {"a": sum(a.values()), "b": sum(b.values()),
                                                    "delta": sum(b.values()) - sum(a.values())}}


def diff(path_a: str, path_b: str) -> dict[str, Any]:
    """Everything `datakit diff` reports, as JSON-able data."""
    from datakit.io.atomic import SHAPE_ERRORS, damaged_run_report
    from datakit.io.sinks import manifest_checksums
    from datakit.io.verify import verify_dataset

    ma, ra = _load(path_a)
    mb, rb = _load(path_b)
    for path, m in ((path_a, ma), (path_b, mb)):  # present with their recorded sizes (DatasetVerifyError)
        verify_dataset(path, m)
    ca, cb = manifest_checksums(ma), manifest_checksums(mb)
    same = ca == cb and bool(ca)
    if same:  # "same data" is said of the bytes, not of what the manifests say they were
        from datakit import progress

        # (both datasets are read once: a progress line per file hashed, as every long step has)
        st = progress.step("diff: hashing both outputs' data files (tasks: files)", total=2 * len(ca))
        ok = False
        try:
            for path, m in ((path_a, ma), (path_b, mb)):
                verify_dataset(path, m, checksums=True, hashed=st.advance)
            ok = True
        finally:
            st.finish(rows=int(ma.get("rows") or 0) + int(mb.get("rows") or 0), ok=ok)  # the rows they hold
    changed_files = sorted(f for f in set(ca) | set(cb) if ca.get(f) != cb.get(f))
    try:
        stages, tokens = stage_deltas(ra, rb), token_deltas(ra, rb)
    except SHAPE_ERRORS:
        for path, run in ((path_a, ra), (path_b, rb)):  # a field of the wrong shape: one line, exit 2
            damaged = damaged_run_report(f"{path.rstrip('/')}/_run.json", run)
            if damaged is not None:
                raise damaged from None
        raise
    return {
        "diff_version": 1,
        "a": path_a, "b": path_b,
        "verdict": "same data" if same else "data differs",
        "config": config_diff(ma.get("pipeline") or ra.get("pipeline") or {}, mb.get("pipeline") or rb.get("pipeline") or {}),
        "stages": stages,
        "documents": document_diff(path_a, ma, path_b, mb),
        "tokens": tokens,
        "files": {"a": len(ca), "b": len(cb), "differing": changed_files[:MAX_LISTED], "n_differing": len(changed_files)},
    }


def _fmt(v: Any) -> str:
    return html.escape(json.dumps(v) if not isinstance(v, str) else v)


def to_html(d: dict[str, Any]) -> str:
    """The diff as one self-contained page (same style as _report.html; plot of the token mix)."""
    from datakit.quality.report import _CSS, _barh, _table

    cfg = d["config"]
    cfg_html = _table(["setting", "change", "A", "B"],
                      [[c["path"], c["change"], _fmt(c.get("a", "")), _fmt(c.get("b", ""))] for c in cfg]) \
        if cfg else "<p>no pipeline setting differs</p>"
    rows = []
    for s in d["stages"]:
        drops = "; ".join(f"{r}: {v['a']:,} → {v['b']:,}" for r, v in s["dropped"].items() if v["delta"]) or "-"
        ri, ro = s.get("rows_in", {}), s.get("rows_out", {})
        rows.append([s["stage"], ri.get("a", 0), ri.get("b", 0), ro.get("a", 0), ro.get("b", 0), ro.get("delta", 0), drops])
    st_html = _table(["stage", "rows in A", "rows in B", "rows out A", "rows out B", "Δ out", "drop reasons that moved"],
                     rows, {1, 2, 3, 4, 5})
    docs = d["documents"]
    doc_html = (f"<p>{docs['common']:,} {html.escape(docs['key'])}s in both · <b>{docs['added']:,} only in B</b> · "
                f"<b>{docs['removed']:,} only in A</b></p>")
    for side, key in (("only in B", "added_ids"), ("only in A", "removed_ids")):
        if docs[key]:
            doc_html += f"<p>{side} (first {len(docs[key])}): <code>{html.escape(', '.join(docs[key]))}</code></p>"
    t = d["tokens"]
    tok_rows = [[g["kind"], g["language"], g["a"], g["b"], g["delta"]] for g in t["groups"]]
    tok_html = _table(["kind", "language", f"{t['unit']} A", f"{t['unit']} B", "Δ"], tok_rows, {2, 3, 4})
    moved = [g for g in t["groups"] if g["delta"]]
    if moved:
        tok_html = _barh([f"{g['kind']}|{g['language']}" for g in moved], [g["delta"] for g in moved],
                         f"Δ {t['unit']} (B - A) per kind|language", t["unit"]) + tok_html
    verdict_cls = "ok" if d["verdict"] == "same data" else "fail"
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>datakit diff</title><style>{_CSS}</style></head>"
            f"<body><h1>datakit diff</h1><p class='muted'>A: {html.escape(d['a'])}<br>B: {html.escape(d['b'])}</p>"
            f"<section id='verdict'><h2>Verdict</h2><p class='{verdict_cls}'>{html.escape(d['verdict'])}</p>"
            f"<p class='muted'>{d['files']['n_differing']} of {max(d['files']['a'], d['files']['b'])} data files differ</p></section>"
            f"<section id='config'><h2>Pipeline config</h2>{cfg_html}</section>"
            f"<section id='stages'><h2>Per-stage counts</h2>{st_html}</section>"
            f"<section id='documents'><h2>Documents added and removed</h2>{doc_html}</section>"
            f"<section id='tokens'><h2>Token mix per kind and language</h2>{tok_html}</section></body></html>")


def summary_lines(d: dict[str, Any]) -> list[str]:
    """What the CLI prints: the verdict first, then one line per changed setting and moved stage."""
    lines = [f"verdict: {d['verdict']}"]
    for c in d["config"]:
        if c["change"] == "changed":
            lines.append(f"config: {c['path']}: {json.dumps(c['a'])} -> {json.dumps(c['b'])}")
        else:
            lines.append(f"config: {c['path']}: {c['change']} ({json.dumps(c.get('a', c.get('b')))})")
    for s in d["stages"]:
        ro = s.get("rows_out", {})
        if ro.get("delta"):
            lines.append(f"stage {s['stage']}: rows out {ro['a']} -> {ro['b']} ({ro['delta']:+d})")
    docs = d["documents"]
    lines.append(f"documents: {docs['added']} only in B, {docs['removed']} only in A, {docs['common']} in both")
    t = d["tokens"]["total"]
    if d["tokens"]["groups"]:  # records or tokens were profiled (an events output has no kind/language mix)
        lines.append(f"{d['tokens']['unit']}: {t['a']} -> {t['b']} ({t['delta']:+d})")
    return lines
