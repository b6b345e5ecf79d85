"""The `datakit` command's entry point: a local `datakit run` restarts itself once with the allocator
the pool workers use (mimalloc, `datakit/allocator.py`), then runs the CLI.

Why: a run whose input is small (`scheduler.SMALL_INPUT_BYTES`) or that is given `--workers 1`
does all of its work in this process, which kept the interpreter's malloc, so the work the pool
workers do with mimalloc cost more here. Measured on 2 cores, 3 alternated runs each, outputs
identical: the quickstart pipeline on 10k events (in-process by default) 23.2-25.1 -> 20.3-20.8
CPU-s, wall 17.2-19.1 -> 15.7-15.9 s, peak RSS 638-644 -> 618-630 MB; a tokenize-only run of
32 MB with `--workers 1` 23.0 -> 17.7 CPU-s. An allocator can only be chosen when a process
starts (`LD_PRELOAD`), so the command starts again (`execv`: same process id, same arguments)
before it imports anything heavy: ~0.05 CPU-s. This module imports nothing but the standard
library and `datakit.allocator` until then.

Only the command, only `run`, only on the local engine: a script or notebook that imports datakit
keeps its allocator; `--engine spark` starts a JVM, which must not inherit the preload (nor the
transparent-huge-pages flag that mimalloc's option sets for the process and its children). Once
restarted, the variables this module added are taken out of the environment again (as a pool
worker does), so anything the run starts gets the environment the user gave. The same opt-outs as
the workers': `DATAKIT_ALLOCATOR=system`, or a user's own `LD_PRELOAD` (kept whole, nothing added).
`python -m datakit.cli` restarts the same way (`restart_for_module_run`, from the top of `datakit.cli`,
before its imports); other ways in (a script calling `datakit.cli.main`) do not. `_run.json` names this process's allocator
(`timing.allocator`) beside the workers' (`timing.workers.allocators`).
"""
from __future__ import annotations

import os
import sys

# set in the restarted process's environment: the variables the restart added (comma-separated)
RESTARTED = "_DATAKIT_COMMAND_RESTARTED"


def command() -> None:
    """The `datakit` console script: `restart_with_worker_allocator()`, then `datakit.cli.command`."""
    restart_with_worker_allocator(sys.argv[1:])
    from datakit.cli import command as cli_command

    cli_command()


def restart_for_module_run() -> None:
    """`restart_with_worker_allocator` for `python -m datakit.cli ...`, called by `datakit.cli` first thing
    while Python is still locating the module (sys.argv[0] is then "-m"): the arguments are the ones
    after `-m datakit.cli` in the interpreter's command line."""
    argv = list(getattr(sys, "orig_argv", None) or ())
    i = 1
    while i < len(argv):  # the interpreter's options, up to its `-m`
        a = argv[i]
        if a == "-m":
            if argv[i + 1:i + 2] == ["datakit.cli"]:
                restart_with_worker_allocator(argv[i + 2:])
            return
        if not a.startswith("-") or a in ("-", "-c"):  # a script, stdin or `-c`: not `-m datakit.cli`
            return
        i += 2 if a in ("-X", "-W") else 1


def restarts(args: list[str]) -> bool:
    """Whether a command with these arguments restarts with the workers' allocator: `run` on the
    local engine (the default)."""
    if not args or args[0] != "run":
        return False
    for i, a in enumerate(args):
        if a == "--engine" and i + 1 < len(args):
            return args[i + 1] == "local"
        if a.startswith("--engine="):
            return a.split("=", 1)[1] == "local"
    return True


def restart_with_worker_allocator(args: list[str]) -> None:
    """Restart this process with `allocator.worker_env()` added to its environment (see module doc),
    or, in the restarted process, take those variables out again. Returns when no restart applies."""
    from datakit import allocator

    if allocator.forget_added(RESTARTED):  # this is the restarted process
        return
    if not restarts(args) or not getattr(sys, "orig_argv", None):
        return
    try:
        env = allocator.worker_env()  # empty off Linux, with DATAKIT_ALLOCATOR=system or a user's LD_PRELOAD
    except allocator.AllocatorError:
        return  # the run reports the bad DATAKIT_ALLOCATOR (engines.get_engine)
    if not env:
        return
    for stream in (sys.stdout, sys.stderr):  # what was printed so far is not lost with the old image
        if stream is not None:
            stream.flush()
    try:
        os.execve(sys.executable, sys.orig_argv, {**os.environ, **env, RESTARTED: ",".join(env)})
    except OSError:  # not restartable here (an embedded interpreter): run as we are
        pass
