"""Log set-up of the `datakit` command: text or one JSON object per line, PII redacted from every line.

Why redact in the handler: a message may quote a path, a value or an error
from a library that quotes a value; checking every call site cannot be
complete, the handler sees every line. The scrubber is the scrub_pii stage's
own pattern detectors (no NER), loaded on the first line that needs it.
"""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, Literal

Format = Literal["text", "json"]

# What `configure` set up, so spawned worker processes can install the same handler (see `worker_config`).
_current: dict[str, Any] = {"fmt": "text", "root": logging.WARNING, "datakit": logging.NOTSET}


def _redact(text: str) -> str:
    from datakit.quality.expect import redact

    # a message quoting a record's repr has its line breaks escaped: patterns anchored at a line start
    # (author and copyright lines) did not see them (found in review: "Copyright (c) 2024 <a name>")
    return redact(text.replace("\\n", "\n"), limit=4000)


class RedactingFilter(logging.Filter):
    """Replace personal data and secrets in the formatted message (and exception text) by placeholders."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            msg = record.getMessage()
        except Exception:
            msg = str(record.msg)
        record.msg, record.args = _redact(msg), ()
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            record.exc_text = _redact(f"{type(e).__name__}: {e}")
            record.exc_info = None
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and structured fields (progress) when present."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(), "logger": record.name, "msg": record.getMessage(),
        }
        if getattr(record, "progress", None):
            obj["progress"] = record.progress
        if record.exc_text:
            obj["error"] = record.exc_text
        return json.dumps(obj, sort_keys=True, default=str)


def _install(fmt: Format, root_level: int) -> None:
    """The one redacting stderr handler on the root logger (replacing any others)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(RedactingFilter())
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(root_level)


def worker_config() -> tuple[str, int, int]:
    """(format, root level, datakit level) for `init_worker` in a spawned process.

    Why: a spawned worker starts with no logging configuration, so a warning logged
    inside a task went through Python's last-resort handler straight to stderr --
    unredacted, bypassing `RedactingFilter`. The pool passes this to every worker.
    """
    return (_current["fmt"], _current["root"], _current["datakit"])


def init_worker(fmt: str, root_level: int, datakit_level: int) -> None:
    """Pool initializer: the parent's log set-up (always redacting), in a worker process."""
    _install("json" if fmt == "json" else "text", root_level)
    logging.getLogger("datakit").setLevel(datakit_level)
    if datakit_level >= logging.WARNING:  # the parent shows no INFO lines (quiet, or progress bars): nor does a
        for h in logging.getLogger().handlers:  # library logger with its own INFO level here (see `configure`)
            h.setLevel(logging.WARNING)


def error_line(message: str) -> str:
    """A command's one-line error as the configured format writes it: `datakit: error: ...` for people,
    one JSON object (level ERROR, logger datakit.cli) under `--log-format json`, so a scheduler that
    parses every line of stderr also parses the failure (found in review: it got plain text)."""
    if _current.get("fmt") == "json":
        now = time.time()
        return json.dumps({"ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now % 1 * 1000):03d}Z",
                           "level": "error", "logger": "datakit.cli", "msg": message}, sort_keys=True)
    return f"datakit: error: {message}"


def configure(fmt: Format = "text", quiet: bool = False) -> None:
    """Root handler on stderr; progress mode follows: bars on a terminal, log lines otherwise, off when quiet."""
    from datakit import progress

    _install(fmt, logging.WARNING)
    if quiet:  # warnings and errors only, whatever an earlier configure() set
        progress.configure("off")
        logging.getLogger("datakit").setLevel(logging.WARNING)
        # and from any library: a logger that sets its own level (great_expectations sets one of its
        # loggers to INFO at import) would otherwise pass its INFO lines through the root handler
        for h in logging.getLogger().handlers:
            h.setLevel(logging.WARNING)
    elif fmt == "json" or not sys.stderr.isatty():
        progress.configure("log")
        logging.getLogger("datakit").setLevel(logging.INFO)
    else:
        progress.configure("bar")
        logging.getLogger("datakit").setLevel(logging.WARNING)
    _current.update(fmt=fmt, root=logging.WARNING, datakit=logging.getLogger("datakit").level)


def route_hub_logs() -> None:
    """Send huggingface_hub's log records through the root logger's handlers only (call after importing it).

    Why: the library installs its own stderr handler and also propagates, so every retry warning of a
    failed download was printed twice, once bypassing the redacting filter (found in review: 23 s of
    doubled "Name or service not known" lines from `datakit evals pull` offline)."""
    hub = logging.getLogger("huggingface_hub")
    for h in list(hub.handlers):
        if type(h) is logging.StreamHandler:
            hub.removeHandler(h)
    hub.propagate = True
