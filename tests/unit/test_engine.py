"""The engine with a scripted origin and a real block store in a temp dir."""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from sidecar.cache import BlockStore
from sidecar.engine import Engine, Source
from sidecar.errors import OriginBadBody, OriginUnavailable
from sidecar.model import ObjectInfo
from sidecar.telemetry.metrics import Metrics

BLOCK = 64 * 1024


class ScriptedOrigin:
    """Serves `data` in blocks, records each call, can be slowed down or made to fail."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.calls: list[tuple[int, int]] = []
        self.delay = 0.0
        self.fail_with: Exception | None = None

    async def read_range(
        self, info: ObjectInfo, start: int, end: int, lane: str
    ) -> AsyncIterator[bytes]:
        self.calls.append((start, end))
        await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            raise self.fail_with
        for offset in range(start, end, 10_000):  # chunks that do not align with blocks
            yield self.data[offset:min(end, offset + 10_000)]
            await asyncio.sleep(0)


@pytest.fixture()
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(max_workers=2) as pool:
        yield pool


async def make_engine(
    tmp_path: Path, executor: ThreadPoolExecutor, data: bytes, slots: int = 32, max_run: int = 8
) -> tuple[Engine, ScriptedOrigin, ObjectInfo, BlockStore]:
    metrics = Metrics(CollectorRegistry())
    store = await BlockStore.open(tmp_path, slots * (BLOCK + 4096), BLOCK, executor, metrics)
    origin = ScriptedOrigin(data)
    info = ObjectInfo("b", "k", len(data), '"e1"', datetime(2026, 1, 1, tzinfo=UTC))
    return Engine(store, origin, metrics, BLOCK, max_run), origin, info, store


async def collect(engine: Engine, info: ObjectInfo, start: int, end: int, lazy: bool = False
                  ) -> tuple[bytes, set[Source]]:
    out, sources = bytearray(), set()
    async for piece, source in engine.stream(info, start, end, lazy=lazy):
        out += piece
        sources.add(source)
    return bytes(out), sources


async def test_concurrent_readers_share_one_fetch(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    data = random.Random(1).randbytes(4 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data)
    origin.delay = 0.05
    results = await asyncio.gather(*(collect(engine, info, 10, BLOCK + 20) for _ in range(10)))
    assert all(body == data[10:BLOCK + 21] for body, _ in results)
    assert origin.calls == [(0, 2 * BLOCK)]
    for _ in range(100):  # the fetched blocks land in the cache in the background
        if store.block_count() == 2:
            break
        await asyncio.sleep(0.01)
    body, sources = await collect(engine, info, 0, 2 * BLOCK - 1)
    assert body == data[:2 * BLOCK] and sources == {Source.CACHE}
    await store.close()


async def test_misses_coalesce_around_cached_blocks_within_max_run(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    data = random.Random(2).randbytes(12 * BLOCK + 5)
    engine, origin, info, store = await make_engine(tmp_path, executor, data, max_run=4)
    await collect(engine, info, 2 * BLOCK, 3 * BLOCK - 1)
    origin.calls.clear()
    body, sources = await collect(engine, info, 0, len(data) - 1)
    assert body == data and sources == {Source.CACHE, Source.ORIGIN}
    assert origin.calls == [
        (0, 2 * BLOCK), (3 * BLOCK, 7 * BLOCK), (7 * BLOCK, 11 * BLOCK), (11 * BLOCK, len(data)),
    ]
    await store.close()


async def test_lazy_stream_fetches_only_what_is_consumed(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    data = random.Random(3).randbytes(10 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data)
    stream = engine.stream(info, 100, len(data) - 1, lazy=True)
    piece, source = await anext(stream)
    assert data[100:BLOCK].startswith(bytes(piece)) and source is Source.ORIGIN
    await stream.aclose()
    await asyncio.sleep(0.05)
    assert origin.calls == [(0, BLOCK)]
    await engine.close()
    await store.close()


async def test_origin_failure_reaches_every_waiter_and_is_not_cached(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    data = random.Random(4).randbytes(3 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data)
    origin.fail_with = OriginUnavailable("origin down")
    origin.delay = 0.02
    results = await asyncio.gather(
        *(collect(engine, info, 0, 3 * BLOCK - 1) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(result, OriginUnavailable) for result in results)
    assert len(origin.calls) == 1 and store.block_count() == 0
    origin.fail_with = None
    assert (await collect(engine, info, 0, 3 * BLOCK - 1))[0] == data
    await store.close()


async def test_random_ranges_through_a_small_cache(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    data = random.Random(5).randbytes(20 * BLOCK + 333)
    engine, origin, info, store = await make_engine(tmp_path, executor, data, slots=6)
    rng = random.Random(6)
    for _ in range(150):
        start = rng.randrange(len(data))
        end = min(len(data) - 1, start + rng.randrange(4 * BLOCK))
        assert (await collect(engine, info, start, end, lazy=rng.random() < 0.5))[0] \
            == data[start:end + 1]
    assert store.block_count() <= 6
    await store.close()


async def test_warm_fetches_once_is_idempotent_and_protects_from_a_scan(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    data = random.Random(7).randbytes(40 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data, slots=10)
    result = await engine.warm(info, 0, 4 * BLOCK - 1, ttl_s=3600)
    assert (result.requested_blocks, result.fetched, result.already_cached, result.failed) \
        == (4, 4, 0, 0)
    assert result.bytes_fetched == 4 * BLOCK and len(origin.calls) == 4
    again = await engine.warm(info, 0, 4 * BLOCK - 1, ttl_s=3600)
    assert (again.fetched, again.already_cached, len(origin.calls)) == (0, 4, 4)
    # A scan of three times the cache does not evict what was warmed (half the
    # cache may be protected) ...
    await collect(engine, info, 10 * BLOCK, 40 * BLOCK - 1)
    origin.calls.clear()
    body, sources = await collect(engine, info, 0, 4 * BLOCK - 1)
    assert body == data[:4 * BLOCK] and sources == {Source.CACHE} and origin.calls == []
    # ... and once read, the blocks are ordinary cache entries again.
    assert store.protected_blocks() == 0
    await store.close()


async def test_warm_counts_origin_failures(tmp_path: Path, executor: ThreadPoolExecutor) -> None:
    data = random.Random(8).randbytes(3 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data)
    origin.fail_with = OriginUnavailable("down")
    result = await engine.warm(info, 0, len(data) - 1, ttl_s=60)
    assert (result.requested_blocks, result.failed, result.fetched) == (3, 3, 0)
    assert store.block_count() == 0
    await store.close()


async def test_a_miss_streams_its_first_bytes_before_the_block_lands(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    data = random.Random(9).randbytes(2 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data)
    gate = asyncio.Event()

    async def slow_tail(info: ObjectInfo, start: int, end: int, lane: str
                        ) -> AsyncIterator[bytes]:
        origin.calls.append((start, end))
        yield data[start:start + 1000]
        await gate.wait()  # the rest of the block is held back
        yield data[start + 1000:end]

    origin.read_range = slow_tail  # type: ignore[method-assign]
    stream = engine.stream(info, 0, 499, lazy=False)
    piece, source = await asyncio.wait_for(anext(stream), timeout=5)
    assert bytes(piece) == data[:500] and source is Source.ORIGIN
    assert store.block_count() == 0  # the block has not landed yet
    gate.set()
    await stream.aclose()
    for _ in range(100):
        if store.block_count() == 1:
            break
        await asyncio.sleep(0.01)
    assert (await collect(engine, info, 0, BLOCK - 1))[1] == {Source.CACHE}
    await store.close()


async def test_hits_and_misses_count_who_started_the_origin_read(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    data = random.Random(10).randbytes(6 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data)
    metrics = engine._metrics
    origin.delay = 0.05
    # One bounded request over 3 missing blocks starts one coalesced fetch: 3 misses.
    first = asyncio.ensure_future(collect(engine, info, 0, 3 * BLOCK - 1))
    await asyncio.sleep(0.01)
    # A second reader joining that fetch causes no origin read: hits, bytes from cache.
    second, sources = await collect(engine, info, BLOCK, 2 * BLOCK - 1)
    assert second == data[BLOCK:2 * BLOCK] and sources == {Source.CACHE}
    assert (await first)[1] == {Source.ORIGIN}
    assert metrics.value("sidecar_cache_lookups_total", {"result": "miss"}) == 3
    assert metrics.value("sidecar_cache_lookups_total", {"result": "hit"}) == 1
    assert len(origin.calls) == 1
    await engine.close()
    await store.close()


@pytest.mark.parametrize("wrong", ["short", "long"])
async def test_an_origin_read_of_the_wrong_length_fails_its_readers_and_caches_nothing_wrong(
    tmp_path: Path, executor: ThreadPoolExecutor, wrong: str
) -> None:
    """A reader must not wait forever for bytes that will not come (short), and
    bytes beyond the range asked go into no block (long: the origin's own check
    is sidecar.origin.client; the engine only refuses to overflow its buffers)."""
    data = random.Random(11).randbytes(3 * BLOCK)
    engine, origin, info, store = await make_engine(tmp_path, executor, data)

    async def wrong_length(info: ObjectInfo, start: int, end: int, lane: str
                           ) -> AsyncIterator[bytes]:
        origin.calls.append((start, end))
        yield data[start:end - 100] if wrong == "short" else data[start:end] + b"\0" * 100

    try:
        origin.read_range = wrong_length  # type: ignore[method-assign]
        if wrong == "short":
            with pytest.raises(OriginBadBody):
                await asyncio.wait_for(collect(engine, info, 0, 3 * BLOCK - 1), timeout=5)
        else:
            body, _ = await asyncio.wait_for(collect(engine, info, 0, 3 * BLOCK - 1), timeout=5)
            assert body == data
        for _ in range(100):  # blocks that did complete land in the background
            if store.block_count() == (2 if wrong == "short" else 3):
                break
            await asyncio.sleep(0.01)
        assert store.block_count() == (2 if wrong == "short" else 3)
        origin.read_range = ScriptedOrigin(data).read_range  # type: ignore[method-assign]
        assert (await collect(engine, info, 0, 3 * BLOCK - 1))[0] == data
    finally:
        await engine.close()
        await store.close()
