"""Stop signals and the ledger's writes: the first signal waits for a write in progress."""

from __future__ import annotations

import os
import signal

import pytest

from tuner.study.signals import StopSignal, deferred, stopping_on_signals


def test_a_signal_inside_a_deferred_block_is_raised_when_the_block_ends():
    after_kill = []
    with pytest.raises(StopSignal) as e:
        with stopping_on_signals():
            with deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                after_kill.append("the write went on")  # not cut in two
                with deferred():  # nested: raised only when the outermost block ends
                    pass
                after_kill.append("and so did the rest of it")
            after_kill.append("never: raised at the block's end")
    assert after_kill == ["the write went on", "and so did the rest of it"]
    assert e.value.signum == signal.SIGTERM and e.value.exit_code == 143


def test_a_signal_outside_a_deferred_block_is_raised_at_once_and_a_block_after_it_does_not_raise_again():
    reached = []
    with pytest.raises(StopSignal):
        with stopping_on_signals():
            try:
                os.kill(os.getpid(), signal.SIGINT)
                reached.append("never")
            except StopSignal:
                with deferred():  # the clean-up's writes after the first signal
                    reached.append("clean-up write")
                raise
    assert reached == ["clean-up write"]


def test_deferred_outside_a_stopping_block_changes_nothing():
    with deferred():
        pass
