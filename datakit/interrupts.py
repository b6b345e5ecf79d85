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


@contextmanager
def held_until_done(what: str) -> Iterator[None]:
    """Run the block with a first SIGINT held until it ends (then KeyboardInterrupt); a second one raises
    at once. Outside the main thread (where no signal handler can be set) the block runs as is."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield  # (a process started with SIGINT ignored, `cmd &` in a script, keeps ignoring it)
        return
    held: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        if held:
            raise KeyboardInterrupt()
        held.append(signum)
        log.warning("interrupted while %s: finishing it first (Ctrl-C again to stop now)", what)

    previous = signal.signal(signal.SIGINT, hold)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if held:
        raise KeyboardInterrupt()
