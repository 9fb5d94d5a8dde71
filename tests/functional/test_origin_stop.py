"""The origin client's stop, in this process against moto: its fetch threads
are joined off the event loop, one waiting for its bandwidth budget does not
hold the stop, and a cancelled fetch's thread stops at its next chunk."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.config import load_config
from sidecar.isolation.lanes import LaneLimiter
from sidecar.model import FOREGROUND, ObjectInfo
from sidecar.origin.client import Origin
from sidecar.telemetry.metrics import Metrics
from sidecar.tools.local_s3 import LocalS3
from tests.support.waiting import eventually_async

pytestmark = pytest.mark.functional

MiB = 1024 * 1024
SIZE = 4 * MiB


async def started_origin(local_s3: LocalS3, tmp_path: Path, metrics: Metrics,
                         limiter: LaneLimiter | None = None) -> Origin:
    config = load_config({"origin_endpoint": local_s3.endpoint, "cache_dir": str(tmp_path)},
                         {}, {})
    origin = Origin(config.origin, metrics, limiter=limiter)
    await origin.start()
    return origin


@pytest.fixture()
async def object_info(origin_s3: Any, bucket: str, local_s3: LocalS3, tmp_path: Path
                      ) -> AsyncIterator[ObjectInfo]:
    key = "seg/stop.log"
    origin_s3.put_object(Bucket=bucket, Key=key, Body=random.Random(3).randbytes(SIZE))
    origin = await started_origin(local_s3, tmp_path, Metrics(CollectorRegistry()))
    try:
        yield await origin.head(bucket, key)
    finally:
        await origin.close()


async def test_the_stop_joins_a_fetch_thread_busy_in_its_sink_off_the_loop(
    local_s3: LocalS3, tmp_path: Path, object_info: ObjectInfo,
) -> None:
    """A fetch thread is in its sink (a cache disk write that takes its time)
    when the stop comes: the loop keeps turning while the stop waits for it,
    and the stop ends once the write has."""
    origin = await started_origin(local_s3, tmp_path, Metrics(CollectorRegistry()))
    writing, written = threading.Event(), threading.Event()

    def slow_disk(offset: int, data: memoryview) -> None:
        writing.set()
        written.wait(10)  # released by the loop below, if the loop still turns

    fetch = asyncio.ensure_future(origin.fetch_into(object_info, 0, SIZE, FOREGROUND,
                                                    slow_disk, MiB))
    await eventually_async(writing.is_set, "the fetch thread to be in its sink")
    # As the engine's stop does: the thread goes on with its chunk, and the
    # cancelled fetch ends once it has.
    fetch.cancel()
    closing = asyncio.ensure_future(origin.close())
    turned_at = time.monotonic()
    await asyncio.sleep(0.05)
    assert time.monotonic() - turned_at < 2.0, "the loop was held by the stop"
    assert not closing.done() and not fetch.done() and not written.is_set()
    written.set()  # the write ends: so do the fetch and the stop
    await asyncio.wait_for(closing, 10)
    await asyncio.wait_for(asyncio.gather(fetch, return_exceptions=True), 10)


async def test_the_stop_ends_a_fetch_thread_waiting_for_its_bandwidth_budget(
    local_s3: LocalS3, tmp_path: Path, object_info: ObjectInfo,
) -> None:
    """At 1 MiB/s with 12 MiB of foreground debt, the fetch's thread would
    wait 12 s for its next chunk: the stop does not."""
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    limiter = LaneLimiter(MiB, {}, time.monotonic)
    limiter.take(FOREGROUND, 12 * MiB)  # the debt of the reads before
    origin = await started_origin(local_s3, tmp_path, metrics, limiter)
    landed: list[int] = []
    fetch = asyncio.ensure_future(origin.fetch_into(
        object_info, 0, SIZE, FOREGROUND, lambda offset, data: landed.append(offset), MiB))
    await eventually_async(
        lambda: (registry.get_sample_value("sidecar_ratelimit_wait_seconds_total",
                                           {"lane": FOREGROUND}) or 0) > 0,
        "the fetch thread to wait for its budget")
    fetch.cancel()
    await asyncio.gather(fetch, return_exceptions=True)
    started = time.monotonic()
    await asyncio.wait_for(origin.close(), 10)
    assert time.monotonic() - started < 5.0
    assert landed == []  # nothing read past the budget


async def test_a_cancelled_fetch_hands_its_sink_nothing_after_the_chunk_in_hand(
    local_s3: LocalS3, tmp_path: Path, object_info: ObjectInfo,
) -> None:
    """The engine cancels a fetch (a sibling GET failed, the reader's request
    ended, the stop) and then hands its cache slots on: the fetch's thread
    must not go on writing the rest of its range into them, and the
    cancellation ends only once the chunk the thread holds is written."""
    origin = await started_origin(local_s3, tmp_path, Metrics(CollectorRegistry()))
    writing, written = threading.Event(), threading.Event()
    landed: list[int] = []
    order: list[str] = []

    def slow_disk(offset: int, data: memoryview) -> None:
        landed.append(offset)
        writing.set()
        written.wait(10)
        order.append("chunk written")

    fetch = asyncio.ensure_future(origin.fetch_into(object_info, 0, SIZE, FOREGROUND,
                                                    slow_disk, MiB))
    try:
        await eventually_async(writing.is_set, "the fetch thread to be in its sink")
        fetch.cancel()
        # The disk write ends a while after the cancellation reached the fetch.
        asyncio.get_running_loop().call_later(0.2, written.set)
        await asyncio.gather(fetch, return_exceptions=True)
        order.append("fetch ended")
    finally:
        written.set()
        await origin.close()  # the threads joined: whatever they would hand on, they have
    assert landed == [0]
    assert order == ["chunk written", "fetch ended"]
