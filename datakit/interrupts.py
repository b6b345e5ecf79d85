"""A Ctrl-C during a run's commit waits until the commit and its clean-up are done.

Why: both engines commit a dataset (shards, manifest, `_SUCCESS`) and then remove the run's work
folder, `<output>/_work/`. A Ctrl-C between the two exited 130 with the dataset published and
~70 MB of work files left inside it (found in an operations review), which every copy of the dataset
then carried. The commit and the clean-up take well under a second on a local disk, so the first
Ctrl-C there is held until they end and then raised as usual (exit 130, the dataset complete and
clean); a second Ctrl-C raises at once, for an operator who will not wait (a slow object store).
"""
from __future__ import annotations

import logging
import signal
import threading
from contextlib import contextmanager
from typing import Any, Iterator

log = logging.getLogger("datakit.interrupts")


class Terminated(KeyboardInterrupt):
    """SIGTERM in the `datakit` command, raised where a Ctrl-C would be (`terminate_like_interrupt`)."""


_TERMINATED: list[bool] = []  # set once this process got a SIGTERM it turned into `Terminated`


def was_terminated() -> bool:
    """Whether this process was stopped by SIGTERM (typer turns the exception into exit 130, as for
    Ctrl-C: the command checks this to end by SIGTERM instead)."""
    return bool(_TERMINATED)


def _on_terminate(signum: int, frame: Any) -> None:
    _TERMINATED[:] = [True]
    raise Terminated()


def terminate_like_interrupt() -> None:
    """Make SIGTERM stop this process the way Ctrl-C does: workers killed, a commit finished first.

    Why: schedulers (Kubernetes, Airflow, systemd timeouts) stop a job with SIGTERM, not Ctrl-C; its
    default action ended the command at once, so a SIGTERM right after a snapshot's own commit left it
    committed with its `_work/` inside and the union not committed, and no last log line (found in an
    operations review). For the `datakit` command only (a notebook keeps its own handling), and only
    when SIGTERM has its default action. The command then ends by SIGTERM (exit status 143)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_terminate)


@contextmanager
def held_until_done(what: str) -> Iterator[None]:
    """Run the block with a first SIGINT (or SIGTERM, once `terminate_like_interrupt` made it one) held
    until it ends, then raised; a second one raises at once. Outside the main thread (where no signal
    handler can be set) the block runs as is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    # (a process started with SIGINT ignored, `cmd &` in a script, keeps ignoring it)
    signals = [s for s, ours in ((signal.SIGINT, signal.getsignal(signal.SIGINT) is not signal.SIG_IGN),
                                 (signal.SIGTERM, signal.getsignal(signal.SIGTERM) is _on_terminate)) if ours]
    held: list[int] = []

    def stop(signum: int) -> KeyboardInterrupt:
        return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()

    def hold(signum: int, frame: Any) -> None:
        if signum == signal.SIGTERM:
            _TERMINATED[:] = [True]
        if held:
            raise stop(signum)
        held.append(signum)
        log.warning("interrupted while %s: finishing it first (Ctrl-C again to stop now)", what)

    previous = {s: signal.signal(s, hold) for s in signals}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if held:
        raise stop(held[0])
