"""The memory tier's pages taken at start (sidecar.cache.tier_reserve): a step
at a time in the executor, every page of a real tier, stopped when asked, and
cut short without raising when the kernel refuses memory."""

from __future__ import annotations

import asyncio
import errno
from concurrent.futures import ThreadPoolExecutor

from sidecar.cache.disk_work import DiskWork
from sidecar.cache.memory_tier import MemoryTier
from sidecar.cache.tier_reserve import RESERVE_STEP_BYTES, Reserved, reserve

MiB = 1024 * 1024


class RefusingTier:
    """A stand-in for a tier whose memory the kernel refuses after one step
    (a cgroup or an overcommit limit cannot be set from a unit test)."""

    size_bytes = 3 * RESERVE_STEP_BYTES

    def __init__(self) -> None:
        self.asked: list[int] = []

    def reserve(self, offset: int, length: int) -> int:
        self.asked.append(offset)
        if len(self.asked) > 1:
            raise OSError(errno.ENOMEM, "Cannot allocate memory")
        return length


async def test_every_page_of_the_tier_is_taken_a_step_at_a_time(
        executor: ThreadPoolExecutor) -> None:
    tier = MemoryTier(2 * RESERVE_STEP_BYTES + MiB, MiB)
    try:
        done = await reserve(tier, DiskWork(asyncio.get_running_loop(), executor),
                             lambda: False)
        assert (done.bytes, done.error) == (tier.size_bytes, None) and done.seconds >= 0
        assert tier.resident_bytes() == tier.size_bytes
    finally:
        tier.close()


async def test_the_reserve_stops_when_asked_between_steps(
        executor: ThreadPoolExecutor) -> None:
    tier = MemoryTier(2 * RESERVE_STEP_BYTES, MiB)
    asked: list[bool] = []

    def stopping() -> bool:
        asked.append(True)
        return len(asked) > 1  # the stop comes during the first step

    try:
        done = await reserve(tier, DiskWork(asyncio.get_running_loop(), executor), stopping)
        assert done == Reserved(RESERVE_STEP_BYTES, done.seconds)
        assert tier.resident_bytes() == RESERVE_STEP_BYTES
    finally:
        tier.close()


async def test_a_refusal_ends_the_reserve_with_its_reason(
        executor: ThreadPoolExecutor) -> None:
    tier = RefusingTier()
    done = await reserve(tier, DiskWork(asyncio.get_running_loop(), executor),  # type: ignore[arg-type]
                         lambda: False)
    assert (done.bytes, done.error) == (RESERVE_STEP_BYTES, "Cannot allocate memory")
    assert tier.asked == [0, RESERVE_STEP_BYTES]  # nothing asked after the refusal
