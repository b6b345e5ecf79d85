"""`_report.html`: the page a person opens after a run (beside `_run.json`).

Why a static file with embedded PNGs: it must open anywhere (a laptop, a CI
artifact viewer, an air-gapped cluster) with no network and no server; one
file, no scripts, no external fonts. Plots are drawn with matplotlib's
object-oriented API (no pyplot: no global backend switch inside a library).

Everything on the page comes from `_run.json` (per-stage counts, drop reasons,
metrics, the profile counted inside the run, expectation results) and
`manifest.json` (packing totals); nothing is read from the data itself, so the
report costs no pass over the output and holds no text from it. Values shown
are counts and names of stages/reasons/types, never data.
"""
from __future__ import annotations

import base64
import html
import io
from typing import Any, Iterable

SECTIONS = [
    ("funnel", "Row funnel per stage"),
    ("lengths", "Document and token lengths"),
    ("dedup", "Dedup clusters"),
    ("pii", "PII findings by type"),
    ("contamination", "Contamination per eval"),
    ("packing", "Packing fill"),
    ("tokens", "Tokens per language and kind"),
    ("quality", "Quality results"),
]

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1100px;color:#1b1f24;background:#fff}
h1{font-size:22px;margin-bottom:4px} h2{font-size:17px;border-bottom:1px solid #d0d7de;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:13px;margin:8px 0} td,th{border:1px solid #d0d7de;padding:3px 8px;text-align:left}
th{background:#f6f8fa} td.n{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#1a7f37;font-weight:600} .fail{color:#cf222e;font-weight:600} .warn{color:#9a6700;font-weight:600}
.muted{color:#57606a} img{max-width:100%;border:1px solid #eaeef2}
"""


# --------------------------------------------------------------------------- plotting helpers

def _png(fig: Any) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    return '<img alt="plot" src="data:image/png;base64,' + base64.b64encode(buf.getvalue()).decode() + '">'


def _figure(w: float = 9, h: float = 3.6):
    from matplotlib.figure import Figure

    return Figure(figsize=(w, h))


def _barh(labels: list[str], values: list[float], title: str, xlabel: str = "rows") -> str:
    fig = _figure(9, max(1.6, 0.32 * len(labels) + 0.9))
    ax = fig.subplots()
    ax.barh(range(len(labels)), values, color="#4c78a8")
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    for i, v in enumerate(values):
        ax.text(v, i, f" {v:,.0f}" if float(v).is_integer() else f" {v:.3g}", va="center", fontsize=7)
    return _png(fig)


def _hist_plot(series: dict[str, dict[str, int]], title: str, xlabel: str) -> str:
    """log2-bucket histograms (bucket b: 2**(b-1) <= n < 2**b) as step lines, one per series."""
    fig = _figure()
    ax = fig.subplots()
    for name, hist in sorted(series.items()):
        xs = sorted(int(b) for b in hist)
        lo, hi = min(xs), max(xs)
        bins = list(range(lo, hi + 1))
        ax.step([2 ** max(b - 1, 0) for b in bins], [hist.get(str(b), 0) for b in bins], where="post",
                label=f"{name} ({sum(hist.values()):,})")
    ax.set_xscale("symlog", base=2)
    ax.set_xlabel(xlabel + " (log2 buckets)")
    ax.set_ylabel("documents")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    return _png(fig)


def _table(head: list[str], rows: Iterable[list[Any]], numeric: set[int] = frozenset()) -> str:
    out = ["<table><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in head) + "</tr>"]
    for r in rows:
        cells = []
        for i, v in enumerate(r):
            if isinstance(v, tuple):  # (html already escaped, css class)
                cells.append(f'<td class="{v[1]}">{v[0]}</td>')
            else:
                txt = f"{v:,}" if isinstance(v, int) else html.escape(str(v))
                cells.append(f'<td class="n">{txt}</td>' if i in numeric else f"<td>{txt}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    return "".join(out) + "</table>"


def _none(msg: str) -> str:
    return f'<p class="muted">{html.escape(msg)}</p>'


# --------------------------------------------------------------------------- sections

def _funnel(run: dict[str, Any]) -> str:
    stages = run.get("stages", [])
    if not stages:
        return _none("no stages ran")
    from matplotlib import colormaps

    fig = _figure(9, max(2.2, 0.45 * len(stages) + 1))
    ax = fig.subplots()
    reasons = sorted({r for s in stages for r in s["dropped"]})
    cmap = colormaps["tab20"]
    labels = [s["name"] for s in stages]
    kept = [s["rows_out"] for s in stages]
    ax.barh(range(len(stages)), kept, color="#4c78a8", label="kept")
    left = list(kept)
    for j, reason in enumerate(reasons):
        vals = [s["dropped"].get(reason, 0) for s in stages]
        ax.barh(range(len(stages)), vals, left=left, color=cmap(j % 20), label=reason)
        left = [a + b for a, b in zip(left, vals)]
    ax.set_yticks(range(len(stages)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("rows in (kept + dropped by reason)")
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.01, 1))
    ax.set_title("rows per stage", fontsize=10)
    rows = []
    for s in stages:
        drops = "; ".join(f"{k}={v:,}" for k, v in s["dropped"].items()) or "-"
        rows.append([s["name"], s["rows_in"], s["rows_out"], s.get("emitted", ""), drops, f"{s['seconds']:.2f}"])
    return _png(fig) + _table(["stage", "rows in", "rows out", "emitted", "dropped by reason", "seconds"], rows, {1, 2, 3})


def _last_profile(run: dict[str, Any], what: str) -> dict[str, Any]:
    for s in reversed(run.get("stages", [])):
        p = s.get("profile", {})
        if what in p:
            return p[what]
    return {}


def _by(hists: dict[str, dict[str, int]], part: int) -> dict[str, dict[str, int]]:
    """Merge `kind|language` histograms by kind (part 0) or language (part 1)."""
    out: dict[str, dict[str, int]] = {}
    for group, h in hists.items():
        key = group.split("|")[part]
        acc = out.setdefault(key, {})
        for b, n in h.items():
            acc[b] = acc.get(b, 0) + n
    return out


def _lengths(run: dict[str, Any]) -> str:
    parts = []
    chars = {}
    for s in run.get("stages", []):  # the last records stage with text lengths
        chars = s.get("profile", {}).get("chars", chars)
    tokens = _last_profile(run, "tokens")
    if chars:
        parts.append(_hist_plot(_by(chars, 0), "document length by kind", "characters"))
        parts.append(_hist_plot(_by(chars, 1), "document length by language", "characters"))
    if tokens:
        parts.append(_hist_plot(_by(tokens, 0), "token length by kind", "tokens"))
        parts.append(_hist_plot(_by(tokens, 1), "token length by language", "tokens"))
    return "".join(parts) or _none("no records were profiled (an events-only pipeline, or no record "
                                   "reached a profiled stage)")


def _stage(run: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((s for s in run.get("stages", []) if s["kind"] == kind), None)


def _dedup(run: dict[str, Any]) -> str:
    s = _stage(run, "dedup")
    if s is None:
        return _none("this pipeline has no dedup stage")
    m = s.get("metrics", {})
    sizes = sorted(((int(k.rsplit("_", 1)[1]) if k.rsplit("_", 1)[1].isdigit() else k.rsplit("_", 1)[1]), v)
                   for k, v in m.items() if k.startswith("near_cluster_size_"))
    out = _table(["removed as", "rows"], [[k, v] for k, v in s["dropped"].items()] or [["-", 0]], {1})
    if sizes:
        out = _barh([f"size {k}" for k, _ in sizes], [v for _, v in sizes], "near-duplicate clusters by size",
                    "clusters") + out
    else:
        out += _none("no near-duplicate clusters")
    return out


def _pii(run: dict[str, Any]) -> str:
    s = _stage(run, "scrub_pii")
    if s is None:
        return _none("this pipeline has no scrub_pii stage")
    found = sorted(((k.split(".", 1)[1], v) for k, v in s.get("metrics", {}).items() if k.startswith("pii.")),
                   key=lambda kv: -kv[1])
    if not found:
        return _none("no PII or secrets found")
    return _barh([k for k, _ in found], [v for _, v in found], "entities replaced or dropped, by type", "findings")


def _contamination(run: dict[str, Any]) -> str:
    s = _stage(run, "decontaminate")
    if s is None:
        return _none("this pipeline has no decontaminate stage")
    per: dict[str, int] = {}
    for k, v in list(s["dropped"].items()) + list(s.get("metrics", {}).items()):
        if k.startswith(("contaminated:", "decontam.masked:")):  # mode drop: drop reasons; mode mask: metrics
            name = k.split(":", 1)[1]
            per[name] = per.get(name, 0) + v
    evals = (run.get("pipeline", {}).get("stages") or [{}])
    configured = next((st.get("evals") for st in evals if st.get("kind") == "decontaminate"), None) or []
    for e in configured:
        per.setdefault(str(e), 0)
    if not per:
        return _none("no eval configured")
    return _barh(sorted(per), [per[k] for k in sorted(per)], "documents matching each eval", "documents")


def _packing(manifest: dict[str, Any] | None) -> str:
    if not manifest or manifest.get("format") not in ("packed", "megatron", "mds"):
        return _none("the output is not packed token sequences")
    t = manifest.get("totals", {})
    shards = manifest.get("shards", [])
    out = ""
    if shards and all("padding_tokens" in s for s in shards):  # packed and mds; megatron stores documents unpadded
        fills = [(1 - s["padding_tokens"] / s["tokens"]) if s.get("tokens") else 0.0 for s in shards]
        out = _barh([f"shard {s['shard']}" for s in shards], fills, "fill rate per shard (non-padding tokens)", "fill")
    rows = [[k, v] for k, v in t.items()]
    rows.insert(0, ["seq_len", manifest.get("seq_len", "")])
    return out + _table(["total", "value"], rows, {1})


def _tokens(run: dict[str, Any]) -> str:
    sums = _last_profile(run, "token_sum")
    if not sums:
        docs = _last_profile(run, "docs")
        if not docs:
            return _none("no tokens counted and no records profiled (no tokenize stage, or no record reached it)")
        return _barh(sorted(docs), [docs[k] for k in sorted(docs)], "documents per kind|language (not tokenized)",
                     "documents")
    keys = sorted(sums, key=lambda k: -sums[k])
    return _barh(keys, [sums[k] for k in keys], "tokens per kind|language", "tokens")


def _quality(run: dict[str, Any]) -> str:
    rows = []
    for s in run.get("stages", []):
        for r in s.get("expectations", []):
            status = ("pass", "ok") if r["success"] else (("FAIL", "fail") if r["severity"] == "error" else ("warn", "warn"))
            col = ", ".join(str(r[k]) for k in ("column", "column_A", "column_B") if k in r)
            # counts only: a failing value's sample stays in _run.json (the page holds no text of the data;
            # found in review: the redacted sample still showed code and user ids)
            rows.append([s["name"], r.get("suite", "expect"), r["type"], col, r["severity"], (status[0], status[1]),
                         r["rows"], r["unexpected"]])
    q = run.get("quality")
    out = ""
    if rows:
        out += _table(["stage", "suite", "expectation", "column", "severity", "result", "rows", "unexpected"],
                      rows, {6, 7})
    if q:
        status = ("pass", "ok") if q.get("success") else ("FAIL", "fail")
        out += f'<p>output suite <b>{html.escape(str(q.get("suite")))}</b>: <span class="{status[1]}">{status[0]}</span>' \
               f' ({q.get("rows", 0):,} rows)</p>'
        if q.get("failed"):
            out += _table(["expectation", "column", "unexpected"],
                          [[f.get("expectation"), f.get("column") or "", f.get("unexpected_count") or ""] for f in q["failed"]])
    return out or _none("no expectations configured (add `expect:` to a stage or `output: {quality: true}`)")


# --------------------------------------------------------------------------- page

def render(run: dict[str, Any], manifest: dict[str, Any] | None = None) -> str:
    """The whole page as one HTML string."""
    bodies = {
        "funnel": _funnel(run), "lengths": _lengths(run), "dedup": _dedup(run), "pii": _pii(run),
        "contamination": _contamination(run), "packing": _packing(manifest), "tokens": _tokens(run),
        "quality": _quality(run),
    }
    name = html.escape(str(run.get("pipeline", {}).get("name", "run")))
    out = run.get("output", {})
    head = (f'<p class="muted">engine {html.escape(str(run.get("engine")))} · {out.get("rows", 0):,} rows in '
            f'{out.get("shards", 0)} shard(s), format {html.escape(str(out.get("format")))} · '
            f'{run.get("seconds", 0):.1f} s · pipeline {html.escape(str(run.get("pipeline_hash", ""))[:16])}</p>')
    nav = " · ".join(f'<a href="#{k}">{html.escape(t)}</a>' for k, t in SECTIONS)
    secs = "".join(f'<section id="{k}"><h2>{html.escape(t)}</h2>{bodies[k]}</section>' for k, t in SECTIONS)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>datakit run report: {name}</title>"
            f"<style>{_CSS}</style></head><body><h1>datakit run report: {name}</h1>{head}<p>{nav}</p>{secs}"
            "</body></html>")


def write_report(path: str) -> str:
    """Render `PATH/_report.html` from `PATH/_run.json` (+ manifest.json); returns the report's path."""
    from datakit.io.atomic import SHAPE_ERRORS, damaged_run_report, read_json_object, write_bytes_atomic

    base = path.rstrip("/")
    run = read_json_object(f"{base}/_run.json")  # damaged (not JSON, not an object): DamagedJSONError
    if run is None:
        top = read_json_object(f"{base}/manifest.json")
        snaps = (top or {}).get("snapshots") if isinstance(top, dict) else None
        if snaps:  # found in a docs review: a dataset of snapshots was "not a datakit output"
            last = max(snaps, key=lambda s: s.get("seq", 0))
            raise FileNotFoundError(f"{base} is a dataset of snapshots: each run reported on its own snapshot, e.g. "
                                    f"datakit report {base}/{last['path']}")
        raise FileNotFoundError(f"{base}: no _run.json (not a datakit output, or the run did not finish)")
    manifest = read_json_object(f"{base}/manifest.json")
    try:
        page = render(run, manifest)
    except SHAPE_ERRORS:
        damaged = damaged_run_report(f"{base}/_run.json", run)  # a field of the wrong shape: one line, exit 2
        if damaged is not None:
            raise damaged from None
        raise
    write_bytes_atomic(f"{base}/_report.html", page.encode())
    return f"{base}/_report.html"
