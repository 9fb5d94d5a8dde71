"""StopDeadline on its own: it ends the process (here: records the call) at the
deadline or at a second signal, with one record naming the step waited for."""

from __future__ import annotations

import logging
import signal

import pytest

from sidecar.stop_deadline import STOP_CUT_SHORT_STATUS, StopDeadline


def test_past_the_deadline_it_ends_the_process_naming_the_step(
        caplog: pytest.LogCaptureFixture) -> None:
    ended: list[int] = []
    deadline = StopDeadline(0.1, lambda: "the index snapshot", end_process=ended.append)
    with caplog.at_level(logging.ERROR, logger="sidecar.stop_deadline"):
        deadline.start()
        deadline.join(timeout=10)
    assert ended == [STOP_CUT_SHORT_STATUS] == [1]
    (record,) = caplog.records
    assert record.event == "stop_cut_short"  # type: ignore[attr-defined]
    assert record.step == "the index snapshot"  # type: ignore[attr-defined]
    assert record.waited_s >= 0.1  # type: ignore[attr-defined]
    assert "did not finish within 0.1s" in record.getMessage()


def test_a_second_signal_ends_it_long_before_the_deadline(
        caplog: pytest.LogCaptureFixture) -> None:
    ended: list[int] = []
    deadline = StopDeadline(3600, lambda: "the listeners", end_process=ended.append)
    with caplog.at_level(logging.ERROR, logger="sidecar.stop_deadline"):
        deadline.start()
        deadline.signalled(signal.SIGTERM, None)
        deadline.join(timeout=10)
    assert ended == [1]
    (record,) = caplog.records
    assert record.reason == "was signalled again"  # type: ignore[attr-defined]
    assert record.waited_s < 10  # type: ignore[attr-defined]
    assert "while still waiting for the listeners" in record.getMessage()
