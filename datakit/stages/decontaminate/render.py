"""How a contamination report is shown: the terminal table (rich) and a self-contained HTML page.

Only presentation lives here; what was found is `result.py`, and every text
shown was redacted before it got here (`redact.py`).
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from datakit.stages.decontaminate.result import CheckResult


def print_table(res: "CheckResult", console=None, examples: int = 3) -> None:
    """The terminal summary: one row per eval, a few examples, and what could not be read.

    Lines other than the table are never broken at the terminal's width (soft_wrap): a warning naming a
    long path came out in two lines, which a log search for it misses."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console()
    t = Table(title=f"contamination check ({res.ngram}-grams, {'+'.join(res.normalizations) or 'raw'})",
              caption=f"a document matches an item if it shares {res.rule.describe()}")
    for col in ("eval", "items", "contaminated", "rate", "status"):
        t.add_column(col, justify="right" if col in ("items", "contaminated", "rate") else "left")
    for e in res.evals:
        # "clean" only when nothing matched: found in review, 16 contaminated items under --threshold 0.1
        # were "clean" in the table
        text, kind = _status(e.rate, e.contaminated_items, res.threshold)
        colour = _COLOURS[kind]
        status = f"[{colour}]{text}[/{colour}]"
        t.add_row(escape(e.name), str(e.items), str(e.contaminated_items), f"{e.rate:.1%}", status)
    console.print(t)
    for e in res.evals:
        shown = 0
        for m in e.matches:
            if shown >= examples:
                break
            where = m.doc_id if m.doc_id is not None else "(index)"
            # names and ids are data (`app/[slug]/page.py` lost its `[slug]`; `[/]` was a MarkupError, found in
            # review): escaped, never read as rich markup
            console.print(f"  [bold]{escape(e.name)}[/bold] {escape(str(m.eval_id))} <- {escape(str(where))}  "
                          f"overlap {m.overlap:.0%}", highlight=False, soft_wrap=True)
            console.print("    " + " ".join(m.snippet.split()), markup=False, highlight=False,
                          no_wrap=True, overflow="ellipsis", crop=True)
            shown += 1
    total_docs = sum(int(d.get("documents") or 0) for d in res.data)
    console.print(f"{total_docs} documents, {len(res.data)} source(s), threshold {res.threshold:.1%}, "
                  f"{res.seconds:.2f}s", highlight=False, soft_wrap=True)
    near = sum(len(e.near_threshold) for e in res.evals)
    if near:
        console.print(f"{near} item(s) came near the threshold without matching (listed in the JSON/HTML report)",
                      highlight=False, soft_wrap=True)
    for e in res.evals:
        if e.items_without_ngrams:
            console.print(f"[yellow]warning:[/yellow] {escape(e.name)}: {e.items_without_ngrams} of {e.items} items have "
                          f"no {res.ngram}-gram to look for (too short, or only common code): they can never match",
                          highlight=False, soft_wrap=True)
    indexed = sum(d.get("mode") == "index" for d in res.data)
    if indexed and res.robust:  # found in review: renamed copies a scan finds were "clean" by an index, unsaid
        console.print(f"[yellow]warning:[/yellow] {indexed} source(s) answered from an n-gram index, which holds "
                      "the normalized text only: copies with identifiers renamed or comments stripped are found "
                      "by a scan (--no-index)", highlight=False, soft_wrap=True)
    if res.skipped_lines:
        no_text = sum(int(d.get("rows_without_text") or 0) for d in res.data)
        why = f" ({no_text} of them rows with no text field: pass --text-field)" if no_text else ""
        console.print(f"[yellow]warning:[/yellow] {res.skipped_lines} unreadable line(s) skipped{why}; the verdict "
                      f"covers only the documents that were read", highlight=False, soft_wrap=True)
    not_utf8 = sum(int(d.get("lines_not_utf8") or 0) for d in res.data)
    if not_utf8:
        console.print(f"[yellow]warning:[/yellow] {not_utf8} line(s) held bytes that are not UTF-8; they were read with "
                      "U+FFFD in their place (an n-gram across such a byte cannot match)", highlight=False, soft_wrap=True)
    for d in res.data:
        if d.get("ignored_files"):
            shown = ", ".join(d.get("ignored_examples") or [])
            console.print(f"[yellow]warning:[/yellow] {escape(str(d['path']))}: {d['ignored_files']} file(s) not read, "
                          f"not a data file type ({escape(shown)}{', ...' if d['ignored_files'] > 3 else ''}); "
                          "name them or convert them to check them", highlight=False, soft_wrap=True)
    if res.redaction.method != "scrub_pii":
        console.print(f"[yellow]warning:[/yellow] snippets redacted by the regex fallback ({res.redaction.reason})",
                      highlight=False, markup=False, soft_wrap=True)


def render_html(res: "CheckResult") -> str:
    """A self-contained HTML report (no scripts, no external assets)."""
    e_ = html.escape
    # three states, as the terminal table says them: found in review, items contaminated under --threshold
    # made the page's title "clean" and its row green while the table said "within threshold"
    rows = "".join(
        f"<tr class='{kind}'><td>{e_(e.name)}</td><td>{e.items}</td><td>{e.contaminated_items}</td>"
        f"<td>{e.rate:.2%}</td><td>{text}</td><td>{e.items_without_ngrams}</td></tr>"
        for e in res.evals for text, kind in [_status(e.rate, e.contaminated_items, res.threshold)])
    sections = []
    for e in res.evals:
        items = "".join(
            f"<tr><td>{e_(i.eval_id)}</td><td>{i.ngrams_matched}/{i.ngrams}</td><td>{i.overlap:.0%}</td>"
            f"<td>{'' if i.documents is None else i.documents}</td></tr>" for i in e.contaminated)
        matches = "".join(
            f"<tr><td>{e_(m.eval_id)}</td><td>{e_(m.doc_id or '(index)')}</td><td>{m.overlap:.0%}</td>"
            f"<td>{_numbered(m.eval_excerpt, m.eval_spans, m.eval_line, m.eval_field)}</td>"
            f"<td>{_numbered(m.doc_excerpt, m.doc_spans, m.doc_line, m.data) if m.doc_excerpt is not None else '(index: no document)'}</td></tr>"
            for m in e.matches)
        near = "".join(f"<tr><td>{e_(x.eval_id)}</td><td>{x.ngrams_matched}/{x.ngrams}</td><td>{x.overlap:.1%}</td>"
                       f"<td>{e_(x.doc_id or '')}</td></tr>" for x in e.near_threshold)
        sections.append(
            f"<h2>{e_(e.name)}</h2><p>source: {e_(e.source)}; fields: {e_(', '.join(e.fields))}</p>"
            + (f"<table><tr><th>item</th><th>n-grams found</th><th>overlap</th><th>documents</th></tr>{items}</table>"
               f"<h3>evidence, side by side (PII redacted; shared text marked)</h3><table><tr><th>item</th>"
               f"<th>document</th><th>overlap</th><th>eval item</th><th>document text</th></tr>{matches}</table>"
               if e.contaminated else "<p>no contaminated items</p>")
            + (f"<h3>near the threshold (not counted)</h3><table><tr><th>item</th><th>n-grams found</th>"
               f"<th>overlap</th><th>closest document</th></tr>{near}</table>" if e.near_threshold else ""))
    data = "".join(f"<li>{e_(str(d.get('path')))} ({e_(str(d.get('mode')))}, {d.get('documents')} documents)</li>"
                   for d in res.data)
    verdict = ("CONTAMINATED" if res.contaminated else
               "within threshold" if any(e.contaminated_items for e in res.evals) else "clean")
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>contamination check: {verdict}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:4px 8px;vertical-align:top}}tr.bad td{{background:#fdd}}tr.ok td{{background:#dfd}}tr.warn td{{background:#ffd}}pre{{margin:0;
white-space:pre-wrap;max-width:50em}}mark{{background:#fd6}}.ln{{color:#999;user-select:none}}</style></head><body>
<h1>Contamination check: {verdict}</h1>
<p>{res.ngram}-grams; normalizations: {e_(', '.join(res.normalizations) or 'none')}; rule: {e_(res.rule.describe())};
threshold: {res.threshold:.2%}</p>
<h2>data</h2><ul>{data}</ul>
<table><tr><th>eval</th><th>items</th><th>contaminated</th><th>rate</th><th>status</th><th>items too short</th></tr>{rows}</table>
{''.join(sections)}
</body></html>
"""


# the terminal table's colour of each status kind (the HTML report's row class is the kind itself)
_COLOURS = {"bad": "red", "warn": "yellow", "ok": "green"}


def _status(rate: float, contaminated_items: int, threshold: float) -> tuple[str, str]:
    """(status, kind) of one eval, for the terminal table and the HTML report alike."""
    if rate > threshold:
        return "CONTAMINATED", "bad"
    return ("within threshold", "warn") if contaminated_items else ("clean", "ok")


def _numbered(text: str | None, spans: list[list[int]], first_line: int | None, where: str | None) -> str:
    """An excerpt as <pre> with line numbers and the shared spans in <mark>."""
    if text is None:
        return ""
    out, pos = [], 0
    for a, b in spans:
        out += [html.escape(text[pos:a]), "<mark>", html.escape(text[a:b]), "</mark>"]
        pos = b
    out.append(html.escape(text[pos:]))
    body = "".join(out).split("\n")
    n0 = first_line or 1
    lines = "\n".join(f"<span class='ln'>{n0 + i:>5} </span>{ln}" for i, ln in enumerate(body))
    return f"<div>{html.escape(where or '')}</div><pre>{lines}</pre>"
