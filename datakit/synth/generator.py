"""The synthetic editor-log generator: sessions of users and orgs over days, with planted ground truth.

Why a generator and not fixtures: every later stage (PII, dedup, decontamination,
consent) needs input whose right answer is known, at sizes from a unit test
(100 events) to a benchmark (millions). The generator streams: it holds one
session and the plant schedule in memory, never the events.

Determinism: all randomness comes from `random.Random` seeded with strings
derived from `(seed, day, session number)`, the corpus is read in sorted order,
JSON is written with fixed key order, and zstd runs single-threaded, so the
same arguments give byte-identical files.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import heapq
import io
import json
import os
import random
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from datakit.synth import events as ev
from datakit.synth import plants as pl
from datakit.synth import repos as rp
from datakit.synth.corpus import shared_corpus

GROUND_TRUTH_FILE = "_ground_truth.jsonl"
SUMMARY_FILE = "_synth.json"
OPTOUTS_FILE = "optouts.parquet"
GROUND_TRUTH_VERSION = "synth_ground_truth.v1"

EVENT_MIX = (("tab_completion", 0.58), ("inline_edit", 0.16), ("chat_turn", 0.16), ("agent_step", 0.10))
TAB_OUTCOMES = (("accepted", 0.34), ("partial", 0.10), ("rejected", 0.26), ("ignored", 0.30))
EDIT_OUTCOMES = (("accepted", 0.6), ("rejected", 0.3), ("ignored", 0.1))
MALFORMED_KINDS = ("bad_json", "bad_utf8", "wrong_type", "missing_field", "unknown_event_type")
NEAR_DUP_VARIANTS = ("fork", "copy_edit", "reformat")
CLIENT_VERSIONS = ("0.41.2", "0.42.0", "0.42.3", "0.43.1", "1.0.0-beta.2")


def _hex(rng: random.Random, n: int) -> str:
    return f"{rng.getrandbits(4 * n):0{n}x}"


def _uuid(rng: random.Random) -> str:
    h = _hex(rng, 32)
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) % 4]}{h[17:20]}-{h[20:]}"


@dataclass
class User:
    user_id: str
    org_id: str
    repos: list[str]
    client_version: str
    language: str  # "python" | "c" | "other": the pool this user mostly works in
    privacy: bool = False
    opted_out: bool = False

    @property
    def clean(self) -> bool:
        return not self.privacy and not self.opted_out


@dataclass(order=True)
class Plant:
    """One scheduled plant: `due` is the global event index at which it should appear."""

    due: int
    seq: int
    kind: str = field(compare=False)
    args: dict = field(compare=False, default_factory=dict)


class _PartWriter:
    """Writes `dt=DAY/part-NNNNN.jsonl.zst`, rotating every `rows_per_part` lines."""

    def __init__(self, root: Path, day: str, rows_per_part: int, level: int) -> None:
        self.dir = root / f"dt={day}"
        self.day, self.rows_per_part, self.level = day, rows_per_part, level
        self.part, self.line, self._fh, self._z, self._buf = -1, 0, None, None, None
        self.files: list[str] = []

    def _open(self) -> None:
        self.close()
        self.part += 1
        self.line = 0
        name = f"dt={self.day}/part-{self.part:05d}.jsonl.zst"
        self.files.append(name)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.dir / f"part-{self.part:05d}.jsonl.zst", "wb")
        self._z = zstandard.ZstdCompressor(level=self.level, threads=0).stream_writer(self._fh, closefd=False)
        self._buf = io.BufferedWriter(self._z, 1 << 20)  # type: ignore[arg-type]

    def write(self, line: bytes) -> tuple[str, int]:
        """Write one line; return (file relative to the output root, 1-based line number)."""
        if self._buf is None or self.line >= self.rows_per_part:
            self._open()
        self._buf.write(line + b"\n")  # type: ignore[union-attr]
        self.line += 1
        return self.files[-1], self.line

    def close(self) -> None:
        if self._buf is not None:
            self._buf.flush()
            self._z.close()  # type: ignore[union-attr]
            self._fh.close()  # type: ignore[union-attr]
            self._buf = self._z = self._fh = None


def _dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


class SynthArgumentError(ValueError):
    """An argument of `generate` out of its range: `datakit synth` shows it as one line, exit 2 (it was a
    traceback, exit 1, which the CLI documents as "a check failed")."""


class SynthFolderError(SynthArgumentError):
    """The output folder holds files synth did not write (`Generator._clear_previous`): one line, exit 2."""


class Generator:
    """Holds the population, corpus cursors and plant schedule; `run()` streams the files."""

    def __init__(self, out_dir: str | os.PathLike, events: int, seed: int, *, days: int, start_date: str,
                 users: int | None, orgs: int | None, rows_per_part: int, plant_scale: float,
                 malformed_rate: float, other_languages: float, zstd_level: int,
                 code_roots: tuple[str, ...] = (), repositories: int = 0) -> None:
        if events < 1:
            raise SynthArgumentError("events must be >= 1")
        if days < 1:
            raise SynthArgumentError("days must be >= 1")
        if rows_per_part < 1:
            raise SynthArgumentError("rows_per_part must be >= 1")
        if not 0.0 <= other_languages <= 1.0:
            raise SynthArgumentError("other_languages is a share: between 0 and 1")
        if repositories < 0:
            raise SynthArgumentError("repositories must be >= 0")
        try:
            dt.date.fromisoformat(start_date)
        except (TypeError, ValueError):
            raise SynthArgumentError(f"start_date {start_date!r} is not a date (YYYY-MM-DD)") from None
        self.repositories = repositories
        self.out = Path(out_dir)
        self.events, self.seed, self.days = events, seed, days
        self.start = dt.date.fromisoformat(start_date)
        self.rows_per_part, self.zstd_level = rows_per_part, zstd_level
        self.other_languages = other_languages
        self.rng = random.Random(f"datakit-synth:{seed}")
        self.corpus = shared_corpus(tuple(code_roots))
        self.cursors = {k: self.rng.randrange(len(v)) for k, v in self.corpus.pools.items()}
        self.used: Counter[str] = Counter()
        self._population(users, orgs)
        self.plants: list[Plant] = []
        self._schedule(plant_scale, malformed_rate)
        self.counts: Counter[str] = Counter()
        self.consent: Counter[str] = Counter()
        self.gt_counts: Counter[str] = Counter()
        self.index = 0  # global index of the next valid event
        self._gt = None

    # ------------------------------------------------------------ population and schedule
    def _population(self, users: int | None, orgs: int | None) -> None:
        rng = self.rng
        n_users = users or max(8, min(20_000, self.events // 60))
        n_orgs = orgs or max(4, n_users // 4)
        org_names = [f"org_{_hex(rng, 6)}" for _ in range(n_orgs)]
        repo_words = ["api", "web", "billing", "infra", "ml-pipeline", "mobile", "auth", "search", "etl", "cli"]
        self.users: list[User] = []
        for i in range(n_users):
            org = org_names[i % n_orgs] if i < n_orgs else rng.choice(org_names)
            repos = [f"{org}/{rng.choice(repo_words)}" for _ in range(rng.randint(1, 2))]
            r = rng.random()
            lang = "python" if r < 0.85 else ("c" if r < 0.95 else "other")
            if lang not in self.corpus.pools:
                lang = next(iter(self.corpus.pools))
            self.users.append(User(f"u_{_hex(rng, 10)}", org, repos, rng.choice(CLIENT_VERSIONS), lang))
        # one org opts out as a whole: the smallest one, so most traffic stays usable
        sizes = Counter(u.org_id for u in self.users)
        self.optout_orgs = [min(sorted(sizes), key=lambda o: (sizes[o], o))] if n_orgs > 2 else []
        order = [i for i in range(n_users) if self.users[i].org_id not in self.optout_orgs]
        rng.shuffle(order)
        n_priv = max(1, round(n_users * 0.10))
        n_opt = max(1, round(n_users * 0.05))
        for i in order[:n_priv]:
            self.users[i].privacy = True
        for i in order[n_priv:n_priv + n_opt]:
            self.users[i].opted_out = True
        for u in self.users:
            if u.org_id in self.optout_orgs:
                u.opted_out = True
        self.optout_users = sorted(u.user_id for u in self.users if u.opted_out and u.org_id not in self.optout_orgs)
        self.optout_user_set = set(self.optout_users)
        self.clean_users = [u for u in self.users if u.clean]
        if not self.clean_users:
            raise ValueError("population has no consenting user; use more users")

    def _schedule(self, scale: float, malformed_rate: float) -> None:
        """Spread the plants over the first 85% of the event stream (room for second copies)."""
        rng, n = self.rng, self.events
        horizon = max(1, int(n * 0.85))
        jobs: list[tuple[str, dict]] = []

        def count(rate: float, minimum: int) -> int:
            return max(minimum, round(n * rate * scale)) if scale > 0 else 0

        for ent in pl.ENTITY_TYPES:
            jobs += [("pii", {"entity": ent})] * count(0.0015, 1 if n < 500 else 2)
        jobs += [("exact_dup", {})] * count(0.002, 2)
        for v in NEAR_DUP_VARIANTS:
            jobs += [("near_dup", {"variant": v})] * count(0.0015, 1 if n < 500 else 2)
        tasks = list(pl.humaneval_tasks())
        rng.shuffle(tasks)
        n_leak = min(len(tasks), count(0.002, 2 if n < 500 else 4))
        for i in range(n_leak):
            jobs.append(("eval_leak", {"task": tasks[i], "where": "chat" if i % 2 == 0 else "file", "edited": i % 4 >= 2}))
        self.planned = Counter(k for k, _ in jobs)
        positions = sorted(rng.randrange(horizon) for _ in jobs)
        rng.shuffle(jobs)
        self.plants = [Plant(p, i, k, a) for i, (p, (k, a)) in enumerate(zip(positions, jobs, strict=True))]
        heapq.heapify(self.plants)
        # malformed lines are extra lines (not counted in `events`), one of each kind at least
        n_bad = max(len(MALFORMED_KINDS), round(n * malformed_rate)) if malformed_rate > 0 else 0
        bad = sorted(rng.randrange(n) for _ in range(n_bad))
        self.malformed = [(p, MALFORMED_KINDS[i % len(MALFORMED_KINDS)]) for i, p in enumerate(bad)]
        self.malformed.reverse()  # pop() from the end = smallest position first

    # ------------------------------------------------------------ corpus
    def _chunk(self, rng: random.Random, language_pool: str) -> tuple[str, str, str]:
        """(text, repo path, language) of the next unused code window of a pool."""
        pool = language_pool if language_pool in self.corpus.pools else "python"
        if pool not in self.corpus.pools:
            pool = next(iter(self.corpus.pools))
        chunks = self.corpus.pools[pool]
        if pool != "python" and "python" in self.corpus.pools and self.used[pool] >= len(chunks):
            # small pools (C headers, bundled files) are used once; then Python takes over,
            # so they never become a source of unplanted duplicates
            return self._chunk(rng, "python")
        i = self.cursors[pool]
        self.cursors[pool] = i + 1
        self.used[pool] += 1
        ch = chunks[i % len(chunks)]
        sf = self.corpus.sources[ch.source]
        return self.corpus.text(ch), sf.path, sf.language

    # ------------------------------------------------------------ event construction
    def _base(self, rng: random.Random, s: "Session", etype: str) -> dict:
        s.clock += dt.timedelta(milliseconds=rng.randint(1500, 90_000))
        ts = s.clock.strftime("%Y-%m-%dT%H:%M:%S.") + f"{s.clock.microsecond // 1000:03d}Z"
        return {
            "event_id": _uuid(rng), "event_type": etype, "timestamp": ts, "user_id": s.user.user_id,
            "org_id": s.user.org_id, "session_id": s.session_id, "client_version": s.user.client_version,
            "privacy_mode": s.privacy, "repo": {"repo_id": s.repo, "commit": s.commit},
        }

    def _tab(self, rng: random.Random, s: "Session", text: str, path: str, lang: str, *, outcome: str | None = None,
             mode: str | None = None, split: tuple[str, str, str] | None = None, suggestion: str | None = None) -> dict:
        e = self._base(rng, s, "tab_completion")
        if split is None:
            mode = mode or rng.choices(["normal", "midline", "empty_prefix", "eof"], [0.7, 0.2, 0.04, 0.06])[0]
            split = ev.split_for_completion(rng, text, mode=mode)
        prefix, truth, suffix = split
        outcome = outcome or ev.weighted(rng, TAB_OUTCOMES)
        if suggestion is None:
            suggestion = truth if outcome in ("accepted", "partial") or rng.random() < 0.3 else ev.wrong_completion(rng, text, truth)
        accepted = suggestion if outcome == "accepted" else (ev.partial_of(rng, suggestion) if outcome == "partial" else None)
        e.update({"file": {"path": path, "language": lang}, "context": {"prefix": prefix, "suffix": suffix},
                  "suggestion": suggestion, "outcome": outcome, "accepted_text": accepted,
                  "latency_ms": rng.randint(40, 900)})
        return e

    def _edit(self, rng: random.Random, s: "Session", text: str, path: str, lang: str, *, outcome: str | None = None,
              prefix_insert: str = "") -> dict:
        e = self._base(rng, s, "inline_edit")
        text = prefix_insert + text
        offs = ev._line_offsets(text)
        n = len(offs) - 1
        a = rng.randint(prefix_insert.count("\n"), max(prefix_insert.count("\n"), n - 3))
        b = min(n, a + rng.randint(2, 8))
        region = text[offs[a]:offs[b]]
        instr, new_region = ev.edit_region(rng, region, lang)
        before, after = text, text[:offs[a]] + new_region + text[offs[b]:]
        b_new = a + len(ev._lines(new_region))
        outcome = outcome or ev.weighted(rng, EDIT_OUTCOMES)
        e.update({"file": {"path": path, "language": lang}, "context": {"prefix": text[:offs[a]], "suffix": text[offs[a]:]},
                  "suggestion": new_region, "outcome": outcome, "accepted_text": new_region if outcome == "accepted" else None,
                  "messages": [{"role": "user", "content": instr, "tool_name": None}],
                  "diff": ev.unified_diff(path, before, after, around=(a, b, b_new)), "latency_ms": rng.randint(300, 6000)})
        return e

    def _chat(self, rng: random.Random, s: "Session", text: str, path: str, lang: str) -> dict:
        e = self._base(rng, s, "chat_turn")
        e.update({"file": {"path": path, "language": lang}, "messages": ev.chat_messages(rng, text, lang, path),
                  "outcome": "rejected" if rng.random() < 0.08 else None, "latency_ms": rng.randint(800, 20_000)})
        return e

    def _agent(self, rng: random.Random, s: "Session", text: str, path: str, lang: str) -> dict:
        e = self._base(rng, s, "agent_step")
        offs = ev._line_offsets(text)
        a = rng.randint(0, max(0, len(offs) - 4))
        b = min(len(offs) - 1, a + rng.randint(2, 6))
        _, new_region = ev.edit_region(rng, text[offs[a]:offs[b]], lang)
        diff = ev.unified_diff(path, text, text[:offs[a]] + new_region + text[offs[b]:],
                               around=(a, b, a + len(ev._lines(new_region))))
        e.update({"file": {"path": path, "language": lang}, "messages": ev.agent_messages(rng, text, lang, path, diff),
                  "diff": diff, "outcome": rng.choice(["accepted", "accepted", "accepted", "rejected"]),
                  "latency_ms": rng.randint(2000, 120_000)})
        if rng.random() < 0.7:
            # most clients also log the edited file (split where the edit starts); some only the trace
            e["context"] = {"prefix": text[:offs[a]], "suffix": text[offs[a]:]}
        return e

    def _normal(self, rng: random.Random, s: "Session") -> list[tuple[dict, list[dict]]]:
        """One ordinary event (or a rejected-then-accepted pair at the same cursor)."""
        pool = s.user.language if rng.random() >= self.other_languages else rng.choice(sorted(self.corpus.pools))
        text, path, lang = self._chunk(rng, pool)
        etype = ev.weighted(rng, EVENT_MIX)
        if etype == "tab_completion":
            e = self._tab(rng, s, text, path, lang)
            if e["outcome"] == "rejected" and rng.random() < 0.4 and s.remaining > 1:
                # the user rejects, keeps typing nothing, re-triggers at the same cursor and accepts
                split = (e["context"]["prefix"], None, e["context"]["suffix"])
                truth = text[len(split[0]): len(text) - len(split[2]) if split[2] else len(text)]
                e2 = self._tab(rng, s, text, path, lang, outcome="accepted", split=(split[0], truth, split[2]), suggestion=truth)
                if truth != e["suggestion"]:
                    gt = {"kind": "preference_pair", "session_id": s.session_id, "rejected_event_id": e["event_id"],
                          "accepted_event_id": e2["event_id"], "consented": self._consents(s)}
                    return [(e, []), (e2, [gt])]
            return [(e, [])]
        if etype == "inline_edit":
            return [(self._edit(rng, s, text, path, lang), [])]
        if etype == "chat_turn":
            return [(self._chat(rng, s, text, path, lang), [])]
        return [(self._agent(rng, s, text, path, lang), [])]

    def _consents(self, s: "Session") -> bool:
        return not s.privacy and not s.user.opted_out

    # ------------------------------------------------------------ plants
    def _plant(self, rng: random.Random, s: "Session", p: Plant) -> list[tuple[dict, list[dict]]]:
        """Events of one plant, each with the ground-truth rows it creates."""
        if p.kind == "pii":
            return [self._plant_pii(rng, s, p.args["entity"])]
        if p.kind in ("exact_dup", "near_dup"):
            text, path, lang = self._chunk(rng, "python")
            e = self._tab(rng, s, text, path, lang, outcome="accepted")
            how = p.args.get("variant")
            copy = text if p.kind == "exact_dup" else pl.variant(rng, text, how, lang)
            heapq.heappush(self.plants, Plant(self.index, p.seq, "dup_copy", {
                "first": e["event_id"], "first_user": s.user.user_id, "text": copy, "path": path, "lang": lang,
                "kind": p.kind, "variant": how, "jaccard": round(pl.jaccard(text, copy), 4)}))
            return [(e, [])]
        if p.kind == "dup_copy":
            a = p.args
            fork_path = a["path"] if a["kind"] == "exact_dup" else a["path"].replace("src/", "vendor/", 1)
            e = self._tab(rng, s, a["text"], fork_path, a["lang"], outcome="accepted")
            if a["kind"] == "exact_dup":
                gt = {"kind": "exact_dup", "event_ids": [a["first"], e["event_id"]], "record_kind": "code"}
            else:
                gt = {"kind": "near_dup", "event_id_a": a["first"], "event_id_b": e["event_id"], "variant": a["variant"],
                      "jaccard": a["jaccard"], "record_kind": "code"}
            return [(e, [gt])]
        if p.kind == "eval_leak":
            return [self._plant_leak(rng, s, p.args)]
        raise AssertionError(p.kind)

    def _plant_pii(self, rng: random.Random, s: "Session", entity: str) -> tuple[dict, list[dict]]:
        where = rng.choices(["tab_completion", "chat_turn", "inline_edit"], [0.6, 0.25, 0.15])[0]
        text, path, lang = self._chunk(rng, "python")
        if where == "chat_turn":
            e = self._base(rng, s, "chat_turn")
            content, found = pl.pii_chat_text(rng, entity)
            e.update({"file": {"path": path, "language": lang},
                      "messages": [{"role": "user", "content": content, "tool_name": None},
                                   {"role": "assistant", "content": "Move the value out of the source file and read it from the environment instead, e.g. `os.environ[...]`; then rotate it, since it has been shared.", "tool_name": None}],
                      "outcome": None, "latency_ms": rng.randint(800, 9000)})
            field_, kinds = "messages[0].content", ["sft"]
        else:
            snippet, found = pl.pii_snippet(rng, entity, lang)
            # insert at a line boundary near the top, where constants and comments live
            offs = ev._line_offsets(text)
            k = offs[min(len(offs) - 1, rng.randint(1, 4))]
            planted = text[:k] + snippet + text[k:]
            if where == "tab_completion":
                # cursor after the snippet, so the secret is in the prefix of every record kind
                after = k + len(snippet)
                rest = planted[after:]
                pre, truth, suf = ev.split_for_completion(rng, rest, mode="normal")
                e = self._tab(rng, s, planted, path, lang, outcome="accepted", split=(planted[:after] + pre, truth, suf))
                field_, kinds = "context.prefix", ["code", "fim"]
            else:
                e = self._edit(rng, s, text[k:], path, lang, outcome="accepted", prefix_insert=text[:k] + snippet)
                field_, kinds = "context.prefix", ["code"]
        rows = [{"kind": "pii", "event_id": e["event_id"], "event_type": e["event_type"], "entity": ent, "value": val,
                 "field": field_, "record_kinds": kinds} for ent, val in found]
        return e, rows

    def _plant_leak(self, rng: random.Random, s: "Session", a: dict) -> tuple[dict, list[dict]]:
        task = a["task"]
        prompt, solution = pl.light_edit(rng, task) if a["edited"] else (task["prompt"], task["canonical_solution"])
        if a["where"] == "chat":
            e = self._base(rng, s, "chat_turn")
            e.update({"file": {"path": "scratch/solution.py", "language": "python"},
                      "messages": [{"role": "user", "content": f"Can you implement this function?\n\n```python\n{prompt}```", "tool_name": None},
                                   {"role": "assistant", "content": f"Sure, here is an implementation:\n\n```python\n{prompt}{solution}```\n", "tool_name": None}],
                      "outcome": None, "latency_ms": rng.randint(800, 9000)})
            kinds = ["sft"]
        else:
            e = self._tab(rng, s, prompt + solution, f"src/exercises/{task['entry_point']}.py", "python",
                          outcome="accepted", split=(prompt, solution, ""))
            kinds = ["code", "fim"]
        return e, [{"kind": "eval_leak", "event_id": e["event_id"], "task_id": task["task_id"], "benchmark": "humaneval",
                    "where": a["where"], "edited": a["edited"], "parts": ["prompt", "canonical_solution"], "record_kinds": kinds}]

    # ------------------------------------------------------------ malformed lines
    def _malformed(self, rng: random.Random, s: "Session", kind: str) -> tuple[bytes, str | None]:
        text, path, lang = self._chunk(rng, s.user.language)
        e = self._tab(rng, s, text, path, lang)
        eid = e["event_id"]
        if kind == "bad_json":
            line = _dumps(e).encode()
            return line[: max(10, len(line) // 3)], eid
        if kind == "bad_utf8":
            e["suggestion"] = "@@BAD@@"
            return _dumps(e).encode().replace(b"@@BAD@@", b"caf\xe9 \xff\xfe"), eid
        if kind == "wrong_type":
            key = rng.choice(["latency_ms", "privacy_mode", "context"])
            e[key] = {"latency_ms": "fast", "privacy_mode": "no", "context": "prefix only"}[key]
        elif kind == "missing_field":
            del e[rng.choice(["user_id", "event_id", "context", "timestamp"])]
            eid = e.get("event_id")
        elif kind == "unknown_event_type":
            e["event_type"] = rng.choice(["voice_command", "tab-completion", "TAB_COMPLETION"])
        return _dumps(e).encode(), eid

    # ------------------------------------------------------------ main loop
    def _gt_write(self, row: dict) -> None:
        self.gt_counts[row["kind"]] += 1
        self._gt.write(_dumps(row) + "\n")  # type: ignore[union-attr]

    def _clear_previous(self) -> None:
        """Remove what an earlier `generate` wrote here, and only that: the files its summary lists.

        Why the summary decides: found in a hostile-input review, `synth` into a folder of real editor
        logs (the same `dt=*/part-*.jsonl.zst` layout) deleted every part file, days synth does not
        write included, and replaced the folder's opt-out list. A folder that holds a file of synth's
        names without synth's summary (`_synth.json`) was not written by synth: refused, nothing touched.
        """
        summary = self.out / SUMMARY_FILE
        named = sorted(self.out.glob("dt=*/part-*.jsonl.zst")) + [
            self.out / n for n in (GROUND_TRUTH_FILE, OPTOUTS_FILE) if (self.out / n).exists()]
        if not summary.exists():
            if named:
                raise SynthFolderError(
                    f"{self.out} holds {named[0].relative_to(self.out).as_posix()} but no {SUMMARY_FILE}: these are not "
                    "logs synth wrote, and writing here would replace them; give a new or empty folder")
            return
        try:
            previous = json.loads(summary.read_text(encoding="utf-8"))
            listed = previous["files"]
            if not isinstance(listed, list) or not all(isinstance(f, str) for f in listed):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise SynthFolderError(f"{summary} is damaged (no list of the files synth wrote), so synth cannot tell "
                                   "its files from others here; give a new or empty folder") from None
        if previous.get("incomplete"):  # an interrupted synth marked the folder before writing: its parts are ours
            listed = [p.relative_to(self.out).as_posix() for p in named if p.parent != self.out]
        for rel in listed:
            if re.fullmatch(r"dt=[0-9-]+/part-[0-9]+\.jsonl\.zst", rel):  # (never a path out of this folder)
                (self.out / rel).unlink(missing_ok=True)
        for d in sorted(self.out.glob("dt=*")):
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()
        for name in (GROUND_TRUTH_FILE, OPTOUTS_FILE, SUMMARY_FILE):
            (self.out / name).unlink(missing_ok=True)

    def run(self) -> dict:
        self.out.mkdir(parents=True, exist_ok=True)
        self._clear_previous()
        # the folder is synth's from here on: an interrupted run leaves this mark, and the next run clears it
        (self.out / SUMMARY_FILE).write_text(json.dumps({"format": GROUND_TRUTH_VERSION, "incomplete": True,
                                                         "files": []}) + "\n")
        per_day = self._day_budgets()
        files: list[str] = []
        with open(self.out / GROUND_TRUTH_FILE, "w", encoding="utf-8", newline="\n") as gt:
            self._gt = gt
            for u in self.users:
                if u.privacy:
                    self._gt_write({"kind": "privacy_user", "user_id": u.user_id, "org_id": u.org_id})
            for uid in self.optout_users:
                self._gt_write({"kind": "optout_user", "user_id": uid})
            for oid in self.optout_orgs:
                self._gt_write({"kind": "optout_org", "org_id": oid})
            for d, budget in enumerate(per_day):
                day = self.start + dt.timedelta(days=d)
                writer = _PartWriter(self.out, day.isoformat(), self.rows_per_part, self.zstd_level)
                try:
                    self._day(d, day, budget, writer)
                    for k in range(d, self.repositories, self.days):
                        self._project(k, day, writer)
                finally:
                    writer.close()
                files += writer.files
        self._write_optouts()
        summary = self._summary(files)
        (self.out / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
        return summary

    def _day_budgets(self) -> list[int]:
        """Events per day: weekends get about a third of a weekday's traffic (largest-remainder rounding)."""
        weights = [0.35 if (self.start + dt.timedelta(days=d)).weekday() >= 5 else 1.0 for d in range(self.days)]
        total = sum(weights)
        exact = [self.events * w / total for w in weights]
        budgets = [int(x) for x in exact]
        for d in sorted(range(self.days), key=lambda d: (budgets[d] - exact[d], d))[: self.events - sum(budgets)]:
            budgets[d] += 1
        return budgets

    def _day(self, d: int, day: dt.date, budget: int, w: _PartWriter) -> None:
        n_session = 0
        while budget > 0:
            rng = random.Random(f"datakit-synth:{self.seed}:{d}:{n_session}")
            n_session += 1
            due = self.plants and self.plants[0].due <= self.index
            exclude = self.plants[0].args.get("first_user") if due else None
            if due:
                pool = [u for u in self.clean_users if u.user_id != exclude] or self.clean_users
                user = rng.choice(pool)
            else:
                user = rng.choice(self.users)
            length = min(budget, max(1, int(rng.expovariate(1 / 14)) + 1))
            # sessions start in working hours (UTC, a team around Europe/US east), rarely at night
            hour = min(21.5, max(0.0, rng.gauss(13.5, 3.5)))
            start = dt.datetime.combine(day, dt.time()) + dt.timedelta(seconds=int(hour * 3600))
            privacy = user.privacy or (not due and rng.random() < 0.02)
            s = Session(user, f"s_{_hex(rng, 16)}", rng.choice(user.repos), _hex(rng, 40), privacy, start, length)
            while s.remaining > 0:
                while self.malformed and self.malformed[-1][0] <= self.index:
                    _, kind = self.malformed.pop()
                    line, eid = self._malformed(rng, s, kind)
                    f, ln = w.write(line)
                    self._gt_write({"kind": "malformed", "file": f, "line": ln, "malformed_kind": kind, "event_id": eid})
                if (not s.privacy and s.user.clean and self.plants and self.plants[0].due <= self.index
                        and self._placeable(self.plants[0], s.user)):
                    produced = self._plant(rng, s, heapq.heappop(self.plants))
                else:
                    produced = self._normal(rng, s)
                for e, gts in produced:
                    f, ln = w.write(_dumps(e).encode())
                    for g in gts:
                        self._gt_write({**g, "file": f, "line": ln} if g["kind"] in ("pii", "eval_leak", "preference_pair") else g)
                    self._count(e)
                s.remaining -= len(produced)
            budget -= s.length_done

    # ------------------------------------------------------------ repository projects
    def _project(self, k: int, day: dt.date, w: _PartWriter) -> None:
        """One developer writing a multi-file project (synth/repos.py) in one session, file by file.

        Ground truth: `repository` and `repo_file` rows (final text digest, import
        edges) and one `feedback` row per completion (outcome, accepted share, and
        whether the accepted text is still there at the next event on that file).
        Projects belong to consenting users, so their records reach every stage.
        """
        rng = random.Random(f"datakit-synth:{self.seed}:repo:{k}")
        user = rng.choice(self.clean_users)
        repo = rp.build_repository(rng, self.corpus, user.org_id, k)
        start = dt.datetime.combine(day, dt.time(8)) + dt.timedelta(seconds=rng.randint(0, 8 * 3600))
        s = Session(user, f"s_{_hex(rng, 16)}", repo.repo_id, repo.commit, False, start, 0)
        self._gt_write({"kind": "repository", "repo_id": repo.repo_id, "commit": repo.commit,
                        "language": repo.language, "files": [f.path for f in repo.files]})
        for f in repo.files:
            self._gt_write({"kind": "repo_file", "repo_id": repo.repo_id, "commit": repo.commit, "path": f.path,
                            "language": repo.language, "imports": f.imports,
                            "sha256": hashlib.sha256(f.text.encode()).hexdigest()})
        order = list(repo.files)
        rng.shuffle(order)  # the order files are written in says nothing about their imports
        for f in order:
            produced = self._write_file(rng, s, f, repo.language)
            for i, (e, retained) in enumerate(produced):
                nxt = produced[i + 1][0] if i + 1 < len(produced) else None
                _, ln = w.write(_dumps(e).encode())
                self._count(e)
                acc = e.get("accepted_text")
                self._gt_write({
                    "kind": "feedback", "event_id": e["event_id"], "repo_id": repo.repo_id, "path": f.path,
                    "language": repo.language, "outcome": e["outcome"], "latency_ms": e["latency_ms"],
                    "suggestion_chars": len(e["suggestion"]), "accepted_chars": len(acc) if acc is not None else 0,
                    "retained": retained if nxt is not None and acc is not None else None,
                    "next_event_id": nxt["event_id"] if nxt is not None else None,
                    "gap_ms": _gap_ms(e["timestamp"], nxt["timestamp"]) if nxt is not None else None})

    def _write_file(self, rng: random.Random, s: "Session", f: "rp.RepoFile", lang: str) -> list[tuple[dict, bool | None]]:
        """Completions that write `f.text` from the top in a few steps: (event, is the accepted text kept?)."""
        text, path = f.text, f.path
        offs = ev._line_offsets(text)
        n = len(offs) - 1
        steps = max(1, min(4, n // 12))
        cuts = sorted(rng.sample(range(1, n), steps - 1)) + [n] if n > steps else [n]
        out: list[tuple[dict, bool | None]] = []
        prev = 0
        for j, c in enumerate(cuts):
            pre, truth = text[:offs[prev]], text[offs[prev]:offs[c]]
            last = j == len(cuts) - 1
            if rng.random() < 0.25:
                out.append((self._tab(rng, s, text, path, lang, outcome="ignored", split=(pre, truth, ""),
                                      suggestion=truth if rng.random() < 0.5 else _throwaway(rng, lang)), None))
            if rng.random() < 0.25:
                out.append((self._tab(rng, s, text, path, lang, outcome="rejected", split=(pre, truth, ""),
                                      suggestion=_throwaway(rng, lang)), None))
            r = rng.random()
            if r < 0.12:  # accepted, then deleted: the next event at this cursor no longer has it
                out.append((self._tab(rng, s, text, path, lang, outcome="accepted", split=(pre, truth, ""),
                                      suggestion=_throwaway(rng, lang)), False))
                out.append((self._tab(rng, s, text, path, lang, outcome="accepted", split=(pre, truth, ""),
                                      suggestion=truth), True))
            elif r < 0.32 and not last:  # partial: the kept part is a prefix of the truth, the user types the rest
                out.append((self._tab(rng, s, text, path, lang, outcome="partial", split=(pre, truth, ""),
                                      suggestion=truth), True))
            else:
                out.append((self._tab(rng, s, text, path, lang, outcome="accepted", split=(pre, truth, ""),
                                      suggestion=truth), True))
            prev = c
        if rng.random() < 0.7:  # a follow-up at the end of the finished file
            out.append((self._tab(rng, s, text, path, lang, outcome=rng.choice(["ignored", "rejected"]),
                                  split=(text, "", ""), suggestion=_throwaway(rng, lang)), None))
        return out

    def _placeable(self, p: Plant, user: User) -> bool:
        """A second copy of a duplicate goes to another user (a fork), unless only one user consents."""
        return p.args.get("first_user") != user.user_id or len(self.clean_users) == 1

    def _count(self, e: dict) -> None:
        self.index += 1
        self.counts[e["event_type"]] += 1
        self.counts[f"outcome:{e.get('outcome')}"] += 1
        if e["privacy_mode"]:
            self.consent["privacy_mode"] += 1
        elif e["user_id"] in self.optout_user_set:
            self.consent["opt_out_user"] += 1
        elif e["org_id"] in self.optout_orgs:
            self.consent["opt_out_org"] += 1

    def _write_optouts(self) -> None:
        rng = random.Random(f"datakit-synth:{self.seed}:optouts")
        ghosts = [f"u_{_hex(rng, 10)}" for _ in range(3)]  # deleted accounts that no longer log events
        users = sorted(self.optout_users + ghosts)
        table = pa.table({"user_id": pa.array(users + [None] * len(self.optout_orgs), pa.string()),
                          "org_id": pa.array([None] * len(users) + list(self.optout_orgs), pa.string())})
        pq.write_table(table, self.out / OPTOUTS_FILE, compression="zstd")

    def _summary(self, files: list[str]) -> dict:
        extra = {"repositories": self.repositories, "ordinary_events": self.events} if self.repositories else {}
        return {**extra,
            "format": GROUND_TRUTH_VERSION, "seed": self.seed, "events": self.index, "days": self.days,
            "start_date": self.start.isoformat(), "files": files,
            "users": len(self.users), "orgs": len({u.org_id for u in self.users}),
            "event_types": {k: v for k, v in sorted(self.counts.items()) if not k.startswith("outcome:")},
            "outcomes": {k.split(":", 1)[1].replace("None", "none"): v for k, v in sorted(self.counts.items()) if k.startswith("outcome:")},
            "expected_consent_drops": {k: self.consent.get(k, 0) for k in ("privacy_mode", "opt_out_user", "opt_out_org")},
            "malformed_lines": self.gt_counts.get("malformed", 0),
            "ground_truth": dict(sorted(self.gt_counts.items())),
            "plants_planned": dict(sorted(self.planned.items())),
            "plants_unplaced": len([p for p in self.plants if p.kind != "dup_copy"]),
            "corpus": {"pool_chunks": {k: len(v) for k, v in self.corpus.pools.items()},
                       "chunks_used": dict(sorted(self.used.items())),
                       # > 0 means some code windows were used twice: duplicates beyond the planted ones exist
                       "reused_chunks": sum(max(0, n - len(self.corpus.pools[k])) for k, n in self.used.items())},
        }


def _gap_ms(a: str, b: str) -> int:
    """Milliseconds from timestamp `a` to `b` (the generator's own ISO format)."""
    fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
    return (dt.datetime.strptime(b, fmt) - dt.datetime.strptime(a, fmt)) // dt.timedelta(milliseconds=1)


def _throwaway(rng: random.Random, lang: str) -> str:
    """A suggestion that appears nowhere else (a fresh identifier): if accepted and then deleted, it is gone."""
    name = f"tmp_{_hex(rng, 10)}"
    return {"python": f"{name} = None\n", "go": f"var {name} = 0\n", "rust": f"let {name} = 0;\n"}.get(
        lang, f"const {name} = null;\n")


@dataclass
class Session:
    user: User
    session_id: str
    repo: str
    commit: str
    privacy: bool
    clock: dt.datetime
    length: int
    remaining: int = -1

    def __post_init__(self) -> None:
        self.remaining = self.length

    @property
    def length_done(self) -> int:
        return self.length - self.remaining


def generate(out_dir: str | os.PathLike, events: int = 1000, seed: int = 0, *, days: int = 3,
             start_date: str = "2026-11-01", users: int | None = None, orgs: int | None = None,
             rows_per_part: int = 100_000, plant_scale: float = 1.0, malformed_rate: float = 0.003,
             other_languages: float = 0.1, zstd_level: int = 3, code_roots: list[str] | tuple[str, ...] = (),
             repositories: int = 0) -> dict:
    """Write synthetic editor logs with planted ground truth into `out_dir`; return the summary.

    Layout written::

        out_dir/dt=YYYY-MM-DD/part-NNNNN.jsonl.zst   editor_event.v1 lines (+ planted malformed lines)
        out_dir/_ground_truth.jsonl                  what was planted (schemas/synth_ground_truth.v1.json)
        out_dir/optouts.parquet                      opt-out list: user_id / org_id columns
        out_dir/_synth.json                          this summary (counts, expected consent drops)

    `code_roots` adds source files (.py, .c/.h, .js, .ts, .go, .rs, .sh, .sql, .java,
    .pyx, ...) from folders of this machine to the corpus: more languages and
    text, at the price of logs that are only reproducible where those folders are
    the same (the default corpus is the stdlib, CPython headers and bundled files).

    `events` counts valid events (malformed lines come on top). `plant_scale`
    multiplies plant rates (0 disables plants except malformed lines, which
    `malformed_rate=0` disables). Same arguments -> byte-identical files.

    `repositories=N` adds N project sessions (after the ordinary sessions of a
    day, spread over the days): a consenting user writes a multi-file repository
    with real imports (Python, TypeScript, JavaScript, Go, Rust) through tab
    completions that are accepted, partly accepted, rejected or ignored, some
    accepted ones deleted again; ground truth kinds `repository`, `repo_file`
    and `feedback`. Their events come on top of `events` (the summary counts
    all). `repositories=0` (the default) writes exactly what earlier versions did.
    """
    return Generator(out_dir, events, seed, days=days, start_date=start_date, users=users, orgs=orgs,
                     rows_per_part=rows_per_part, plant_scale=plant_scale, malformed_rate=malformed_rate,
                     other_languages=other_languages, zstd_level=zstd_level, code_roots=tuple(code_roots),
                     repositories=repositories).run()
