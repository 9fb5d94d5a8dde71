"""Interrupts held back while a child starts (tests/support/processes.py): a
benchmark stopped by SIGTERM then stops the child it was starting too."""

from __future__ import annotations

import os
import signal
from types import FrameType

import pytest

from tests.support.processes import interrupts_held


def test_a_signal_while_held_reaches_its_handler_once_after() -> None:
    seen: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGHUP, handler)
    try:
        with interrupts_held():
            os.kill(os.getpid(), signal.SIGHUP)
            os.kill(os.getpid(), signal.SIGHUP)
            assert seen == []  # held: the child's Popen is not interrupted
        assert seen == [signal.SIGHUP]
        assert signal.getsignal(signal.SIGHUP) is handler
    finally:
        signal.signal(signal.SIGHUP, before)


def test_an_interrupt_held_is_raised_once_the_child_is_kept() -> None:
    """SIGTERM as a benchmark handles it (bench/stopping.py): KeyboardInterrupt."""
    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    kept: list[str] = []
    before = signal.signal(signal.SIGTERM, interrupt)
    try:
        with pytest.raises(KeyboardInterrupt), interrupts_held():
            os.kill(os.getpid(), signal.SIGTERM)
            kept.append("child")  # what Popen's caller keeps, before the interrupt
        assert kept == ["child"]
    finally:
        signal.signal(signal.SIGTERM, before)
