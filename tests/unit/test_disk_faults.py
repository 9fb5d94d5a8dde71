"""When a cache disk counts as failing, and when it is trusted again: the read
faults window with a fake clock, and the disk watcher's probe and its hold."""

from __future__ import annotations

import asyncio
import errno
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.cache.faults import ReadFaults
from sidecar.isolation.disk import MAX_HOLD_S, DiskWatcher, probe_write
from tests.support.clock import FakeClock

EIO = OSError(errno.EIO, "Input/output error")


def test_three_errors_within_the_window_make_a_failing_disk() -> None:
    faults = ReadFaults(error_limit=3, window_s=60)
    faults.error(0, EIO)
    faults.error(30, EIO)
    assert faults.problem(30) is None
    faults.error(59, EIO)
    problem = faults.problem(59)
    assert problem is not None and "3 reads failed within 60s (Input/output error)" in problem


def test_errors_spread_wider_than_the_window_do_not() -> None:
    faults = ReadFaults(error_limit=3, window_s=60)
    for now in (0, 40, 80, 120, 160):
        faults.error(now, EIO)
        assert faults.problem(now) is None


def test_mismatches_have_their_own_higher_limit() -> None:
    faults = ReadFaults(error_limit=3, mismatch_limit=16, window_s=60)
    for now in range(15):
        faults.mismatch(now)
    assert faults.problem(15) is None  # a crash's torn blocks, dropped one by one
    faults.mismatch(15)
    problem = faults.problem(15)
    assert problem is not None and "did not match their checksums" in problem


def test_clear_forgets_the_failures_and_bad_limits_are_refused() -> None:
    faults = ReadFaults(error_limit=1)
    faults.error(0, EIO)
    assert faults.problem(0) is not None
    faults.clear()
    assert faults.problem(0) is None
    with pytest.raises(ValueError, match="at least 1"):
        ReadFaults(error_limit=0)


def test_the_probe_reads_back_what_it_wrote(tmp_path: Path) -> None:
    probe_write(tmp_path)
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(OSError):
        probe_write(tmp_path / "missing")


async def test_a_disk_that_fails_again_soon_stays_bypassed_longer(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    clock = FakeClock(1000.0)
    failed = [True]
    recoveries: list[float] = []

    def recovered() -> None:
        failed[0] = False
        recoveries.append(clock())

    watcher = DiskWatcher(tmp_path, 0, 5.0, executor, shrink=lambda n: 0, grow=lambda: 0,
                          failed=lambda: failed[0], recovered=recovered, clock=clock)
    loop = asyncio.get_running_loop()

    async def failing_for(seconds: float) -> float:
        """Checks every second from a new failure until the disk is trusted again."""
        started = clock()
        while failed[0] and clock() - started <= seconds:
            await watcher.check(loop)
            clock.advance(1)
        assert not failed[0], f"still bypassed after {seconds} s"
        return recoveries[-1] - started

    assert await failing_for(10) == 5  # the first failure: one check interval
    failed[0] = True  # fails again at once: twice as long
    assert await failing_for(20) == 10
    failed[0] = True
    assert await failing_for(40) == 20
    clock.advance(MAX_HOLD_S * 10)  # well for a long time: back to one interval
    failed[0] = True
    assert await failing_for(10) == 5
