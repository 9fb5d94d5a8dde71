"""A reload of a sidecar whose cache disk hangs: the configuration is read on a
thread of its own, not behind the disk threads."""

from __future__ import annotations

import asyncio
import threading

from prometheus_client import CollectorRegistry

from sidecar.config import load_config
from sidecar.server import Sidecar

BASE = {"cache_dir": "/x"}


async def test_a_reload_is_not_held_behind_busy_disk_threads() -> None:
    running = load_config(BASE, {}, {"max_requests": 64, "io_threads": 2})
    loaded = load_config(BASE, {}, {"max_requests": 32, "io_threads": 2})
    sidecar = Sidecar(running, CollectorRegistry(), lambda: loaded)
    hung = threading.Event()
    # Every disk thread stuck, as in reads of a cache disk that stopped answering.
    for _ in range(running.server.io_threads):
        sidecar._executor.submit(hung.wait)
    try:
        async with asyncio.timeout(10):
            plan = await sidecar.reload_from_source()
        assert plan.applied == ("max_requests",)
        assert sidecar.config.server.max_requests == 32
    finally:
        hung.set()
        await sidecar.stop()
