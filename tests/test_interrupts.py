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
