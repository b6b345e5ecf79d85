"""`held_until_done`: the first Ctrl-C waits for the block, a second one stops it at once."""
from __future__ import annotations

import os
import signal

import pytest

from datakit.interrupts import held_until_done


def test_the_first_ctrl_c_is_raised_after_the_block():
    done, before = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with held_until_done("testing"):
            os.kill(os.getpid(), signal.SIGINT)
            done.append("rest of the block")  # still runs: the interrupt is held
    assert done == ["rest of the block"]
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_a_second_ctrl_c_stops_the_block_at_once():
    done, before = [], signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        with held_until_done("testing"):
            os.kill(os.getpid(), signal.SIGINT)
            os.kill(os.getpid(), signal.SIGINT)
            done.append("never")
    assert done == []
    assert signal.getsignal(signal.SIGINT) is before


def test_no_ctrl_c_no_interrupt():
    with held_until_done("testing"):
        pass


def test_an_ignored_ctrl_c_stays_ignored():
    """A process started with SIGINT ignored (`cmd &` in a script) got a KeyboardInterrupt after the commit,
    exit 130 (found in review): the hold only replaces a handler that would have raised."""
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with held_until_done("testing"):
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_sigterm_in_the_command_is_held_like_a_ctrl_c_and_raised_as_terminated():
    """Found in an operations review: SIGTERM (what schedulers send) ended the command at once, even
    between a snapshot's commit and the union's. The command makes it a Ctrl-C that says so."""
    from datakit.interrupts import Terminated, terminate_like_interrupt

    before = signal.getsignal(signal.SIGTERM)
    assert before is signal.SIG_DFL  # the test process has no handler of its own
    try:
        terminate_like_interrupt()
        done = []
        with pytest.raises(Terminated):
            with held_until_done("testing"):
                os.kill(os.getpid(), signal.SIGTERM)
                done.append("rest of the block")
        assert done == ["rest of the block"]
        with pytest.raises(Terminated):  # outside a held block it raises at once
            os.kill(os.getpid(), signal.SIGTERM)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])  # (a bytecode boundary for the handler)
            done.append("never")
        assert done == ["rest of the block"]
    finally:
        from datakit import interrupts

        signal.signal(signal.SIGTERM, before)
        interrupts._TERMINATED.clear()


def test_a_sigterm_stops_a_run_like_a_ctrl_c_and_ends_with_sigterm(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    from datakit.synth.generator import generate

    generate(tmp_path / "logs", events=3000, seed=3, days=1)
    quickstart = (Path(__file__).resolve().parents[1] / "pipelines" / "quickstart.yaml").read_text()
    (tmp_path / "q.yaml").write_text(quickstart.replace("../demo/logs", "logs").replace("../demo/out/quickstart", "out"))
    exe = Path(sys.executable).with_name("datakit")
    proc = subprocess.Popen([str(exe), "run", str(tmp_path / "q.yaml"), "--workers", "1"], cwd=tmp_path,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    for line in proc.stderr:  # the first stage done: the run is under way
        lines.append(line)
        if "ingest: done" in line:
            proc.send_signal(signal.SIGTERM)
            break
    lines += proc.stderr.readlines()
    assert proc.wait(timeout=120) == -signal.SIGTERM, "".join(lines)[-3000:]
    err = "".join(lines)
    assert "datakit: stopped (SIGTERM)" in err and "Traceback" not in err
    assert not (tmp_path / "out" / "_SUCCESS").exists()


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, -signal.SIGTERM)])
def test_a_stopped_run_ends_with_a_json_line_under_log_format_json(tmp_path, sig, code):
    """Found in an operations review: under `--log-format json` a SIGTERM ended with plain text and a SIGINT with
    no last line at all; a scheduler parsing stderr saw the process end without a status."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from datakit.synth.generator import generate

    generate(tmp_path / "logs", events=3000, seed=3, days=1)
    quickstart = (Path(__file__).resolve().parents[1] / "pipelines" / "quickstart.yaml").read_text()
    (tmp_path / "q.yaml").write_text(quickstart.replace("../demo/logs", "logs").replace("../demo/out/quickstart", "out"))
    exe = Path(sys.executable).with_name("datakit")
    proc = subprocess.Popen([str(exe), "run", str(tmp_path / "q.yaml"), "--workers", "1", "--log-format", "json"],
                            cwd=tmp_path, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines = []
    for line in proc.stderr:
        lines.append(line)
        if "ingest" in line and '"done": true' in line:
            proc.send_signal(sig)
            break
    lines += proc.stderr.readlines()
    assert proc.wait(timeout=120) == code, "".join(lines)[-3000:]
    last = json.loads(lines[-1])
    assert last["level"] == "error" and last["msg"] == f"stopped ({signal.Signals(sig).name})"
