"""The prefetcher's accounting and bounds, with a fake fetcher and a fake clock."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from prometheus_client import CollectorRegistry

from sidecar.cache import BlockIdent
from sidecar.model import ObjectInfo
from sidecar.prefetch.prefetcher import Prefetcher
from sidecar.prefetch.streams import StreamTable
from sidecar.telemetry.metrics import Metrics

B = 1000
INFO = ObjectInfo("b", "orders-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log",
                  40 * B, '"e"', datetime(2026, 1, 1, tzinfo=UTC))


class FakeFetcher:
    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.gate = asyncio.Event()

    def fetch_ahead(self, info: ObjectInfo, block: int) -> asyncio.Task[None] | None:
        if (info.key, block) in self.started:
            return None
        self.started.append((info.key, block))
        return asyncio.get_running_loop().create_task(self.gate.wait())  # type: ignore[arg-type]


def build(max_in_flight: int = 16, max_pending: int = 100) -> tuple[Prefetcher, FakeFetcher, Metrics]:
    metrics = Metrics(CollectorRegistry())
    fetcher = FakeFetcher()
    table = StreamTable(block_size=B, max_window_blocks=8, idle_s=60, clock=lambda: 0.0)
    prefetcher = Prefetcher(table, fetcher, metrics, head=_no_head, list_keys=None,
                            layout_prefix="", max_in_flight=max_in_flight, max_pending=max_pending)
    return prefetcher, fetcher, metrics


async def _no_head(bucket: str, key: str) -> ObjectInfo:
    raise AssertionError("no cross-segment lookups in these tests")


def fetches(prefetcher: Prefetcher, positions: list[int]) -> None:
    for start in positions:
        stream = prefetcher.on_request(INFO, start)
        prefetcher.on_delivered(stream, INFO, start)
        prefetcher.on_delivered(stream, INFO, start + 300)


def outcome(metrics: Metrics, name: str) -> float:
    return metrics.value("sidecar_prefetch_blocks_total", {"outcome": name})


async def test_used_grows_the_window_wasted_shrinks_it() -> None:
    prefetcher, fetcher, metrics = build()
    fetches(prefetcher, [0, 300, 600])
    assert [b for _, b in fetcher.started] == [1]
    prefetcher.on_block_read(BlockIdent("b", INFO.key, '"e"', 1))
    fetches(prefetcher, [900])  # window 2: blocks 2, 3
    assert [b for _, b in fetcher.started] == [1, 2, 3]
    prefetcher.on_evicted(BlockIdent("b", INFO.key, '"e"', 3), "capacity")
    assert (outcome(metrics, "issued"), outcome(metrics, "used"), outcome(metrics, "wasted")) \
        == (3, 1, 1)
    (stream,) = prefetcher._table.streams((INFO.bucket, INFO.key, INFO.etag))
    assert stream.window == 1
    # An eviction of a block nobody prefetched, or a second read, changes nothing.
    prefetcher.on_evicted(BlockIdent("b", INFO.key, '"e"', 30), "capacity")
    prefetcher.on_block_read(BlockIdent("b", INFO.key, '"e"', 1))
    assert outcome(metrics, "used") == 1 and outcome(metrics, "wasted") == 1
    fetcher.gate.set()


async def test_in_flight_bound_defers_blocks_until_fetches_finish() -> None:
    prefetcher, fetcher, metrics = build(max_in_flight=2)
    fetches(prefetcher, [0, 300, 600])
    stream = prefetcher._table.streams((INFO.bucket, INFO.key, INFO.etag))[0]
    for _ in range(3):
        stream.used(8)  # window 8
    fetches(prefetcher, [900])
    assert [b for _, b in fetcher.started] == [1, 2]
    fetcher.gate.set()
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    fetches(prefetcher, [1200])
    assert [b for _, b in fetcher.started] == [1, 2, 3, 4]  # the deferred ones, two at a time
    assert outcome(metrics, "issued") == 4
