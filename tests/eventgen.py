"""Tiny hand-made editor events for foundation tests (the realistic generator is datakit.synth)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Iterable

import zstandard

TYPES = ("tab_completion", "inline_edit", "chat_turn", "agent_step")


def make_event(i: int, **overrides: Any) -> dict[str, Any]:
    et = TYPES[i % 4]
    ev: dict[str, Any] = {
        "event_id": f"ev-{i:06d}", "event_type": et, "timestamp": f"2026-11-0{1 + i % 3}T10:{i % 60:02d}:00Z",
        "user_id": f"user-{i % 5}", "org_id": f"org-{i % 2}", "session_id": f"sess-{i % 7}",
        "client_version": "1.2.3", "privacy_mode": False, "latency_ms": 100 + i,
    }
    if et == "tab_completion":
        ev.update(file={"path": f"src/mod{i}.py", "language": "python"},
                  context={"prefix": f"def f{i}(x):\n    return ", "suffix": "\n"},
                  suggestion=f"x * {i}", outcome="accepted" if i % 3 else "rejected")
    elif et == "inline_edit":
        ev.update(file={"path": f"src/edit{i}.py", "language": "python"},
                  context={"prefix": "a = 1\n", "suffix": ""}, suggestion="a = 2\n",
                  diff="--- a\n+++ b\n@@ -1 +1 @@\n-a = 1\n+a = 2\n", outcome="accepted")
    else:
        ev.update(messages=[{"role": "user", "content": f"explain {i}"},
                            {"role": "assistant", "content": f"answer {i}"}])
    ev.update(overrides)
    return ev


def write_jsonl(path: Path, rows: Iterable[dict[str, Any] | bytes | str]) -> Path:
    """Write rows (dicts, or raw str/bytes lines for malformed cases) as .jsonl, .jsonl.gz or .jsonl.zst."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = b"".join(
        (r if isinstance(r, bytes) else (r if isinstance(r, str) else json.dumps(r)).encode()) + b"\n" for r in rows
    )
    if path.suffix == ".zst":
        data = zstandard.ZstdCompressor().compress(data)
    elif path.suffix == ".gz":
        data = gzip.compress(data, mtime=0)
    path.write_bytes(data)
    return path
