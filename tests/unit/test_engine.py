"""The engine with a scripted origin and a real block store in a temp dir.

The origin fake delivers chunks to the engine's sink in worker threads, as the
real one does, so blocks land in their slots as in production. Background work
(blocks landing in the cache, read-ahead) is awaited with `Engine.idle()`,
never slept on: an upper bound on origin reads checked after idle() also
catches a late over-fetch.
"""

from __future__ import annotations

import asyncio
import errno
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from sidecar.cache import BlockIdent, BlockStore
from sidecar.cache.block_writes import BlockWrite
from sidecar.cache.slab import Slab
from sidecar.engine import Engine, Piece, Sink, Source
from sidecar.errors import OriginBadBody, OriginError, OriginUnavailable
from sidecar.in_flight import InFlightBlock
from sidecar.isolation.modes import Mode, ModeState
from sidecar.layout import Layout
from sidecar.model import FOREGROUND, PREFETCH, WARM, ObjectInfo
from sidecar.prefetch.planner import ReadAheadPlanner
from sidecar.prefetch.streams import StreamTable
from sidecar.tally import ReadTally
from sidecar.telemetry.metrics import Metrics
from tests.support.clock import FakeClock
from tests.support.waiting import eventually_async

BLOCK = 64 * 1024
MODIFIED = datetime(2026, 1, 1, tzinfo=UTC)


class ScriptedOrigin:
    """Serves objects' bytes, records each call, can be slowed down or made to fail."""

    def __init__(self, data: bytes) -> None:
        self.data: dict[str, bytes] = {"k": data}
        self.calls: list[tuple[int, int]] = []
        self.bypassed: list[tuple[int, int]] = []
        self.lanes: list[str] = []
        self.delay = 0.0
        self.fail_with: Exception | None = None

    def add(self, key: str, data: bytes) -> ObjectInfo:
        self.data[key] = data
        return ObjectInfo("b", key, len(data), f'"{key}"', MODIFIED)

    async def fetch_into(
        self, info: ObjectInfo, start: int, end: int, lane: str, sink: Sink, chunk_size: int,
        *, waited_for: bool = False,
    ) -> None:
        """As the origin client does: whole chunks, aligned, to the sink in a thread."""
        self.calls.append((start, end))
        self.lanes.append(lane)
        await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            raise self.fail_with
        data = self.data[info.key]
        offset = start
        while offset < end:
            upto = min(end, (offset // chunk_size + 1) * chunk_size)
            await asyncio.to_thread(sink, offset, memoryview(data[offset:upto]))
            offset = upto

    async def read_range(
        self, info: ObjectInfo, start: int, end: int, lane: str
    ) -> AsyncIterator[bytes]:
        """What bypasses the cache reads."""
        self.bypassed.append((start, end))
        data = self.data[info.key]
        for offset in range(start, end, 10_000):  # chunks that do not align with blocks
            yield data[offset:min(end, offset + 10_000)]
            await asyncio.sleep(0)

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        return ObjectInfo(bucket, key, len(self.data[key]), f'"{key}"', MODIFIED)

    async def list_keys(self, bucket: str, prefix: str, start_after: str = "") -> list[str]:
        return sorted(key for key in self.data if key.startswith(prefix) and key > start_after)


@dataclass
class Rig:
    engine: Engine
    origin: ScriptedOrigin
    info: ObjectInfo
    store: BlockStore
    metrics: Metrics
    modes: ModeState

    def metric(self, name: str, **labels: str) -> float:
        return self.metrics.value(name, labels)


MakeRig = Callable[..., Awaitable[Rig]]


@pytest.fixture
async def make_rig(tmp_path: Path, executor: ThreadPoolExecutor) -> AsyncIterator[MakeRig]:
    """Engines over a real store; closed (engine, then store) after the test."""
    rigs: list[Rig] = []

    async def make(data: bytes, slots: int = 32, max_run: int = 8,
                   planner: ReadAheadPlanner | None = None, key: str = "k",
                   block: int = BLOCK, parts: int = 1, recent_chunk_bytes: int = 64 * 2**20,
                   memory_tier_bytes: int = 0, direct_io: bool = False,
                   drop_written_pages: bool = False, reserve_tier: bool = False,
                   max_buffered: int | None = None,
                   clock: Callable[[], float] | None = None) -> Rig:
        metrics = Metrics(CollectorRegistry())
        timing = {} if clock is None else {"clock": clock}
        store = await BlockStore.open(tmp_path / f"cache{len(rigs)}", slots * (block + 4096),
                                      block, executor, metrics,
                                      recent_chunk_bytes=recent_chunk_bytes,
                                      memory_tier_bytes=memory_tier_bytes, direct_io=direct_io,
                                      drop_written_pages=drop_written_pages,
                                      reserve_tier=reserve_tier, **timing)
        origin = ScriptedOrigin(data)
        info = origin.add(key, data)
        modes = ModeState()
        engine = Engine(store, origin, metrics, block, max_run, modes=modes, planner=planner,
                        foreground_parts=parts, max_buffered_bytes=max_buffered)
        rigs.append(Rig(engine, origin, info, store, metrics, modes))
        return rigs[-1]

    yield make
    for rig in rigs:
        await rig.engine.close()
        await rig.store.close()


def as_bytes(piece: Piece) -> bytes:
    return bytes(piece)


async def collect(engine: Engine, info: ObjectInfo, start: int, end: int, lazy: bool = False
                  ) -> tuple[bytes, set[Source]]:
    out, sources = bytearray(), set()
    async for piece, source in engine.stream(info, start, end, lazy=lazy):
        out += as_bytes(piece)
        sources.add(source)
    return bytes(out), sources


def read_ahead_planner(max_in_flight: int = 16, max_pending: int = 100,
                       layout: Layout = Layout.PLAIN) -> ReadAheadPlanner:
    table = StreamTable(block_size=BLOCK, max_window_blocks=8, idle_s=60, clock=FakeClock())
    return ReadAheadPlanner(table, max_in_flight=max_in_flight, max_pending=max_pending,
                            layout=layout)


def hold_back_after_first_chunk(rig: Rig) -> asyncio.Event:
    """Each origin fetch delivers its first chunk, then holds the rest back
    until the returned event is set."""
    gate = asyncio.Event()
    real = rig.origin.fetch_into

    async def slow_tail(info: ObjectInfo, start: int, end: int, lane: str, sink: Sink,
                        chunk_size: int, waited_for: bool = False) -> None:
        await real(info, start, start + chunk_size, lane, sink, chunk_size)
        await gate.wait()
        await real(info, start + chunk_size, end, lane, sink, chunk_size)

    rig.origin.fetch_into = slow_tail  # type: ignore[method-assign]
    return gate


async def read_like_a_broker(rig: Rig, info: ObjectInfo, fetch: int) -> bytes:
    """Open-ended requests (`bytes=pos-`), each dropped after `fetch` bytes, the
    next one starting where the last one's bytes ended, as Kafka's remote reader."""
    out = bytearray()
    while len(out) < info.size:
        want = min(fetch, info.size - len(out))
        got = 0
        stream = rig.engine.stream(info, len(out), info.size - 1, lazy=True)
        async with asyncio.timeout(10):
            async for piece, _ in stream:
                chunk = as_bytes(piece)
                out += chunk[:want - got]
                got += len(chunk)
                if got >= want:
                    break
        await stream.aclose()
    return bytes(out)


async def test_concurrent_readers_share_one_fetch(make_rig: MakeRig) -> None:
    data = random.Random(1).randbytes(4 * BLOCK)
    rig = await make_rig(data)
    rig.origin.delay = 0.05
    results = await asyncio.gather(
        *(collect(rig.engine, rig.info, 10, BLOCK + 20) for _ in range(10))
    )
    assert all(body == data[10:BLOCK + 21] for body, _ in results)
    assert rig.origin.calls == [(0, 2 * BLOCK)]
    await rig.engine.idle()  # the fetched blocks land in the cache in the background
    assert rig.store.block_count() == 2
    body, sources = await collect(rig.engine, rig.info, 0, 2 * BLOCK - 1)
    assert body == data[:2 * BLOCK] and sources == {Source.CACHE}


async def test_misses_coalesce_around_cached_blocks_within_max_run(make_rig: MakeRig) -> None:
    data = random.Random(2).randbytes(12 * BLOCK + 5)
    rig = await make_rig(data, max_run=4)
    await collect(rig.engine, rig.info, 2 * BLOCK, 3 * BLOCK - 1)
    await rig.engine.idle()
    rig.origin.calls.clear()
    body, sources = await collect(rig.engine, rig.info, 0, len(data) - 1)
    assert body == data and sources == {Source.CACHE, Source.ORIGIN}
    assert rig.origin.calls == [
        (0, 2 * BLOCK), (3 * BLOCK, 7 * BLOCK), (7 * BLOCK, 11 * BLOCK), (11 * BLOCK, len(data)),
    ]


async def test_lazy_stream_fetches_only_what_is_consumed(make_rig: MakeRig) -> None:
    data = random.Random(3).randbytes(10 * BLOCK)
    rig = await make_rig(data)
    stream = rig.engine.stream(rig.info, 100, len(data) - 1, lazy=True)
    piece, source = await anext(stream)
    assert data[100:BLOCK].startswith(as_bytes(piece)) and source is Source.ORIGIN
    await stream.aclose()
    await rig.engine.idle()
    assert rig.origin.calls == [(0, BLOCK)]


async def test_origin_failure_reaches_every_waiter_and_is_not_cached(make_rig: MakeRig) -> None:
    data = random.Random(4).randbytes(3 * BLOCK)
    rig = await make_rig(data)
    rig.origin.fail_with = OriginUnavailable("origin down")
    rig.origin.delay = 0.02
    results = await asyncio.gather(
        *(collect(rig.engine, rig.info, 0, 3 * BLOCK - 1) for _ in range(3)),
        return_exceptions=True,
    )
    assert all(isinstance(result, OriginUnavailable) for result in results)
    await rig.engine.idle()
    assert len(rig.origin.calls) == 1 and rig.store.block_count() == 0
    rig.origin.fail_with = None
    assert (await collect(rig.engine, rig.info, 0, 3 * BLOCK - 1))[0] == data


async def test_random_ranges_through_a_small_cache(make_rig: MakeRig) -> None:
    data = random.Random(5).randbytes(20 * BLOCK + 333)
    rig = await make_rig(data, slots=6)
    rng = random.Random(6)
    for _ in range(150):
        start = rng.randrange(len(data))
        end = min(len(data) - 1, start + rng.randrange(4 * BLOCK))
        body, _ = await collect(rig.engine, rig.info, start, end, lazy=rng.random() < 0.5)
        assert body == data[start:end + 1]
    await rig.engine.idle()
    assert rig.store.block_count() <= 6


async def test_warm_fetches_once_is_idempotent_and_protects_from_a_scan(
    make_rig: MakeRig
) -> None:
    data = random.Random(7).randbytes(40 * BLOCK)
    rig = await make_rig(data, slots=10)
    result = await rig.engine.warm(rig.info, 0, 4 * BLOCK - 1, ttl_s=3600)
    assert (result.requested_blocks, result.fetched, result.already_cached, result.failed) \
        == (4, 4, 0, 0)
    assert result.bytes_fetched == 4 * BLOCK and len(rig.origin.calls) == 4
    assert set(rig.origin.lanes) == {"warm"}
    again = await rig.engine.warm(rig.info, 0, 4 * BLOCK - 1, ttl_s=3600)
    assert (again.fetched, again.already_cached, len(rig.origin.calls)) == (0, 4, 4)
    # A scan of three times the cache does not evict what was warmed (half the
    # cache may be protected) ...
    await collect(rig.engine, rig.info, 10 * BLOCK, 40 * BLOCK - 1)
    await rig.engine.idle()
    rig.origin.calls.clear()
    body, sources = await collect(rig.engine, rig.info, 0, 4 * BLOCK - 1)
    assert body == data[:4 * BLOCK] and sources == {Source.CACHE} and rig.origin.calls == []
    # ... and once read, the blocks are ordinary cache entries again.
    assert rig.store.protected_blocks() == 0


async def test_warmed_blocks_count_as_protected_until_their_ttl_passes(
    make_rig: MakeRig
) -> None:
    """sidecar_cache_protected_blocks says what a warm-up still holds: blocks
    whose ttl_s passed unread count no more, though nothing touched them since."""
    clock = FakeClock(1000.0)
    rig = await make_rig(random.Random(13).randbytes(8 * BLOCK), clock=clock)
    await rig.engine.warm(rig.info, 0, 4 * BLOCK - 1, ttl_s=60)
    clock.advance(30)
    await rig.engine.warm(rig.info, 4 * BLOCK, 6 * BLOCK - 1, ttl_s=60)
    assert rig.store.protected_blocks() == 6
    clock.advance(31)  # the first call's ttl_s has passed, not the second's
    assert rig.store.protected_blocks() == 2
    clock.advance(30)
    assert rig.store.protected_blocks() == 0


async def test_a_warm_that_joins_a_fetch_on_its_way_protects_the_block(
    make_rig: MakeRig
) -> None:
    """Two warm calls for the same blocks at once, or a warm call meeting a
    reader's fetch: the one that joins waits until the block is cached (not only
    whole), counts it cached and protects it."""
    data = random.Random(12).randbytes(8 * BLOCK)
    rig = await make_rig(data)
    rig.origin.delay = 0.05
    first, second = await asyncio.gather(
        rig.engine.warm(rig.info, 0, 4 * BLOCK - 1, ttl_s=3600),
        rig.engine.warm(rig.info, 0, 4 * BLOCK - 1, ttl_s=3600),
    )
    assert (first.fetched, first.already_cached, first.failed) == (4, 0, 0)
    assert (second.fetched, second.already_cached, second.failed) == (0, 4, 0)
    assert len(rig.origin.calls) == 4 and rig.store.protected_blocks() == 4
    (body, _), joined = await asyncio.gather(
        collect(rig.engine, rig.info, 4 * BLOCK, 8 * BLOCK - 1),
        rig.engine.warm(rig.info, 4 * BLOCK, 8 * BLOCK - 1, ttl_s=3600),
    )
    assert body == data[4 * BLOCK:]
    assert (joined.fetched, joined.already_cached, joined.failed) == (0, 4, 0)
    assert rig.store.protected_blocks() == 8


async def test_warm_counts_origin_failures(make_rig: MakeRig) -> None:
    data = random.Random(8).randbytes(3 * BLOCK)
    rig = await make_rig(data)
    rig.origin.fail_with = OriginUnavailable("down")
    result = await rig.engine.warm(rig.info, 0, len(data) - 1, ttl_s=60)
    assert (result.requested_blocks, result.failed, result.fetched) == (3, 3, 0)
    await rig.engine.idle()
    assert rig.store.block_count() == 0


async def test_a_miss_streams_its_first_chunk_before_the_block_lands(make_rig: MakeRig) -> None:
    big = 2 * 1024 * 1024  # two 1 MiB chunks a block
    data = random.Random(9).randbytes(2 * big)
    rig = await make_rig(data, slots=4, block=big)
    gate = hold_back_after_first_chunk(rig)
    stream = rig.engine.stream(rig.info, 0, 499, lazy=False)
    piece, source = await asyncio.wait_for(anext(stream), timeout=5)
    assert as_bytes(piece) == data[:500] and source is Source.ORIGIN
    assert rig.store.block_count() == 0  # the block has not landed yet
    gate.set()
    await stream.aclose()
    await rig.engine.idle()
    assert rig.store.block_count() == 1
    assert (await collect(rig.engine, rig.info, 0, big - 1))[1] == {Source.CACHE}


async def test_a_reader_dropped_mid_block_lets_go_of_it_at_once(make_rig: MakeRig) -> None:
    """A Kafka fetch hangs up mid-block: closing its stream closes every
    generator under it there and then (none is left for the event loop to
    finalize in a task of its own later), so the block's reader count and its
    slot's pin are back before the next loop iteration."""
    big = 2 * 1024 * 1024  # two 1 MiB chunks a block
    data = random.Random(11).randbytes(2 * big)
    rig = await make_rig(data, slots=4, block=big)
    gate = hold_back_after_first_chunk(rig)
    stream = rig.engine.stream(rig.info, 0, len(data) - 1, lazy=True)
    piece, _ = await asyncio.wait_for(anext(stream), timeout=5)
    assert as_bytes(piece) == data[:len(piece)]
    in_flight, = rig.engine._fetches.on_their_way.values()
    assert in_flight.readers == 1
    await stream.aclose()
    assert in_flight.readers == 0
    gate.set()
    await rig.engine.idle()


async def test_hits_and_misses_count_who_started_the_origin_read(make_rig: MakeRig) -> None:
    data = random.Random(10).randbytes(6 * BLOCK)
    rig = await make_rig(data)
    rig.origin.delay = 0.05
    # One bounded request over 3 missing blocks starts one coalesced fetch: 3 misses.
    first = asyncio.ensure_future(collect(rig.engine, rig.info, 0, 3 * BLOCK - 1))
    await eventually_async(lambda: rig.origin.calls or None, "the coalesced fetch to start")
    # A second reader joining that fetch causes no origin read: hits, bytes from cache.
    second, sources = await collect(rig.engine, rig.info, BLOCK, 2 * BLOCK - 1)
    assert second == data[BLOCK:2 * BLOCK] and sources == {Source.CACHE}
    assert (await first)[1] == {Source.ORIGIN}
    assert rig.metric("sidecar_cache_lookups_total", result="miss") == 3
    assert rig.metric("sidecar_cache_lookups_total", result="hit") == 1
    assert len(rig.origin.calls) == 1


async def test_a_fetch_that_ends_short_fails_its_readers_and_caches_only_whole_blocks(
    make_rig: MakeRig
) -> None:
    """A reader must not wait forever for bytes that will not come; blocks that
    did arrive whole are cached (the origin's own checks of lengths, ranges and
    ETags are sidecar.origin's, tested there)."""
    data = random.Random(11).randbytes(3 * BLOCK)
    rig = await make_rig(data)
    real = rig.origin.fetch_into

    async def short(info: ObjectInfo, start: int, end: int, lane: str, sink: Sink,
                    chunk_size: int, waited_for: bool = False) -> None:
        await real(info, start, end - BLOCK, lane, sink, chunk_size)

    rig.origin.fetch_into = short  # type: ignore[method-assign]
    with pytest.raises(OriginBadBody):
        await asyncio.wait_for(collect(rig.engine, rig.info, 0, 3 * BLOCK - 1), timeout=5)
    await rig.engine.idle()  # blocks that did complete land in the background
    assert rig.store.block_count() == 2
    rig.origin.fetch_into = real  # type: ignore[method-assign]
    assert (await collect(rig.engine, rig.info, 0, 3 * BLOCK - 1))[0] == data


async def test_a_foreground_miss_is_fetched_in_parts_at_once(make_rig: MakeRig) -> None:
    big = 4 * 1024 * 1024  # four chunks a block
    data = random.Random(19).randbytes(2 * big)
    rig = await make_rig(data, slots=4, block=big, parts=4)
    body, sources = await collect(rig.engine, rig.info, 0, big + 10, lazy=True)
    assert body == data[:big + 11] and sources == {Source.ORIGIN}
    await rig.engine.idle()
    mib = 1024 * 1024
    assert sorted(rig.origin.calls) == [(0, mib), (mib, 2 * mib), (2 * mib, 3 * mib),
                                        (3 * mib, 4 * mib), (4 * mib, 5 * mib),
                                        (5 * mib, 6 * mib), (6 * mib, 7 * mib),
                                        (7 * mib, 8 * mib)]
    assert rig.store.block_count() == 2


async def test_a_block_with_no_free_slot_is_read_straight_from_the_origin(
    make_rig: MakeRig
) -> None:
    data = random.Random(20).randbytes(4 * BLOCK)
    rig = await make_rig(data, slots=1)
    held = rig.engine.stream(rig.info, 0, len(data) - 1, lazy=True)
    first, _ = await anext(held)  # a reader is at block 0: its slot is pinned
    body, sources = await collect(rig.engine, rig.info, BLOCK, 2 * BLOCK - 1)
    assert body == data[BLOCK:2 * BLOCK] and sources == {Source.ORIGIN}
    assert rig.origin.bypassed == [(BLOCK, 2 * BLOCK)]
    as_bytes(first)
    await held.aclose()


async def test_read_ahead_is_fetched_by_the_engine_and_used_by_the_reader(
    make_rig: MakeRig
) -> None:
    """The planner says what to fetch ahead; the engine fetches it on the
    prefetch lane, once; the reader then finds it: hits, counted as used."""
    data = random.Random(12).randbytes(12 * BLOCK)
    rig = await make_rig(data, planner=read_ahead_planner())
    body = await read_like_a_broker(rig, rig.info, BLOCK // 4)
    await rig.engine.idle()
    assert body == data
    starts = [start for start, _ in rig.origin.calls]
    assert len(starts) == len(set(starts)) == 12  # every block once, none twice
    assert rig.origin.lanes.count(PREFETCH) >= 9 and rig.origin.lanes[0] == FOREGROUND
    issued = rig.metric("sidecar_prefetch_blocks_total", outcome="issued")
    used = rig.metric("sidecar_prefetch_blocks_total", outcome="used")
    assert issued == rig.origin.lanes.count(PREFETCH) and used == issued
    assert rig.engine.activity() == {"streams": 0, "blocks_in_flight": 0, "buffered_bytes": 0,
                                     "prefetch_in_flight": 0, "prefetch_pending": 0,
                                     "idle": True}


async def test_read_ahead_evicted_unread_is_counted_as_waste(make_rig: MakeRig) -> None:
    data = random.Random(13).randbytes(40 * BLOCK)
    other = random.Random(14).randbytes(8 * BLOCK)
    rig = await make_rig(data, slots=6, planner=read_ahead_planner())
    reader = rig.engine.stream(rig.info, 0, len(data) - 1, lazy=True)
    got = bytearray()
    async for piece, _ in reader:
        got += as_bytes(piece)
        if len(got) >= 3 * BLOCK:  # sequential: read-ahead is under way
            break
    await reader.aclose()
    await rig.engine.idle()
    issued = rig.metric("sidecar_prefetch_blocks_total", outcome="issued")
    assert issued >= 1
    # Another object's scan pushes the unread read-ahead out of the small cache.
    other_info = rig.origin.add("other", other)
    await collect(rig.engine, other_info, 0, len(other) - 1)
    await rig.engine.idle()
    wasted = rig.metric("sidecar_prefetch_blocks_total", outcome="wasted")
    assert wasted == issued and rig.engine.activity()["prefetch_pending"] == 0


# Two consecutive segments of one partition, in Aiven's key layout.
PARTITION = "orders-AAAAAAAAAAAAAAAAAAAAAA/0/"
FIRST_KEY = PARTITION + "00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
SECOND_KEY = PARTITION + "00000000000000000100-CCCCCCCCCCCCCCCCCCCCCC.log"


async def test_read_ahead_continues_into_the_next_segment(make_rig: MakeRig) -> None:
    first, second = random.Random(15).randbytes(4 * BLOCK), random.Random(16).randbytes(4 * BLOCK)
    rig = await make_rig(first, key=FIRST_KEY,
                         planner=read_ahead_planner(layout=Layout.AIVEN))
    second_info = rig.origin.add(SECOND_KEY, second)
    assert await read_like_a_broker(rig, rig.info, BLOCK // 2) == first
    await rig.engine.idle()
    # Before any reader opened the second segment, its first block was fetched.
    assert rig.engine.will_hit(second_info, 0)
    assert rig.origin.lanes[-1] == PREFETCH
    rig.origin.calls.clear()
    assert await read_like_a_broker(rig, second_info, BLOCK // 2) == second
    assert (0, BLOCK) not in rig.origin.calls


async def test_the_next_segment_is_listed_once_however_far_read_ahead_reaches(
    make_rig: MakeRig
) -> None:
    """Each delivery near a segment's end reaches further past it; the
    partition is listed once (S3 bills a LIST as ten GETs), however many
    readers and reaches."""
    first, second = random.Random(19).randbytes(6 * BLOCK), random.Random(20).randbytes(6 * BLOCK)
    rig = await make_rig(first, key=FIRST_KEY,
                         planner=read_ahead_planner(layout=Layout.AIVEN))
    second_info = rig.origin.add(SECOND_KEY, second)
    listings: list[str] = []
    real_list = rig.origin.list_keys

    async def counted_list(bucket: str, prefix: str, start_after: str = "") -> list[str]:
        listings.append(start_after)
        return await real_list(bucket, prefix, start_after)

    rig.origin.list_keys = counted_list  # type: ignore[method-assign]
    for _ in range(3):  # three consumers of the partition, one after another
        assert await read_like_a_broker(rig, rig.info, BLOCK // 4) == first
        await rig.engine.idle()
    assert listings == [FIRST_KEY]
    assert rig.engine.will_hit(second_info, 0)


async def test_an_origin_that_cannot_list_is_not_asked_at_every_reach(
    make_rig: MakeRig
) -> None:
    """A listing the origin refuses (an S3-compatible store without
    start-after) holds the next one off a while, instead of one listing per
    delivery near every segment's end; the readers are served all the same."""
    first = random.Random(21).randbytes(6 * BLOCK)
    rig = await make_rig(first, key=FIRST_KEY,
                         planner=read_ahead_planner(layout=Layout.AIVEN))
    refused: list[str] = []

    async def refusing_list(bucket: str, prefix: str, start_after: str = "") -> list[str]:
        refused.append(start_after)
        raise OriginError("501 NotImplemented")

    rig.origin.list_keys = refusing_list  # type: ignore[method-assign]
    for _ in range(3):
        assert await read_like_a_broker(rig, rig.info, BLOCK // 4) == first
        await rig.engine.idle()
    assert refused == [FIRST_KEY]


@pytest.mark.parametrize("mode", [Mode.NO_PREFETCH, Mode.CACHE_ONLY])
async def test_a_mode_without_read_ahead_stops_the_next_segment_looked_up_meanwhile(
    make_rig: MakeRig, mode: Mode
) -> None:
    """The next segment's look-up (a listing, a HEAD) takes a while; an
    operator who turns read-ahead off (or pauses downloads) meanwhile gets no
    origin read of it once the look-up ends."""
    first, second = random.Random(17).randbytes(4 * BLOCK), random.Random(18).randbytes(4 * BLOCK)
    rig = await make_rig(first, key=FIRST_KEY,
                         planner=read_ahead_planner(layout=Layout.AIVEN))
    second_info = rig.origin.add(SECOND_KEY, second)
    listing, release = asyncio.Event(), asyncio.Event()
    real_list = rig.origin.list_keys

    async def held_list(bucket: str, prefix: str, start_after: str = "") -> list[str]:
        listing.set()
        await release.wait()
        return await real_list(bucket, prefix, start_after)

    rig.origin.list_keys = held_list  # type: ignore[method-assign]
    assert await read_like_a_broker(rig, rig.info, BLOCK // 2) == first
    async with asyncio.timeout(10):
        await listing.wait()
    fetched_before = len(rig.origin.calls)
    rig.modes.request(mode)
    release.set()
    await rig.engine.idle()
    assert not rig.engine.will_hit(second_info, 0)
    assert rig.origin.calls[fetched_before:] == []
    assert rig.engine.activity()["prefetch_in_flight"] == 0


async def test_a_disk_that_fails_a_write_switches_the_sidecar_to_bypass(
    make_rig: MakeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(17).randbytes(2 * BLOCK)
    rig = await make_rig(data)

    def failing(self: Slab, *args: Any, **kwargs: Any) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Slab, "write_chunk", failing)
    body, _ = await collect(rig.engine, rig.info, 0, len(data) - 1)
    assert body == data  # the reader is served whatever the disk does
    await rig.engine.idle()
    assert rig.modes.current is Mode.BYPASS and rig.modes.disk_problem == \
        "ENOSPC: No space left on device"
    assert rig.store.block_count() == 0


async def test_a_disk_that_keeps_failing_reads_switches_the_sidecar_to_bypass(
    make_rig: MakeRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = random.Random(19).randbytes(4 * BLOCK)
    rig = await make_rig(data, recent_chunk_bytes=0)
    assert (await collect(rig.engine, rig.info, 0, len(data) - 1))[0] == data
    await rig.engine.idle()
    assert rig.store.block_count() == 4

    def failing(self: Slab, *args: Any, **kwargs: Any) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(Slab, "read_checked", failing)
    # The cached copy fails, and so does reading back the refetched one: two
    # failed reads; the reader gets the origin's bytes, the cache stays in use.
    body, sources = await collect(rig.engine, rig.info, 0, 99)
    assert body == data[:100] and sources == {Source.ORIGIN}
    await rig.engine.idle()
    assert rig.modes.current is Mode.NORMAL
    assert rig.metric("sidecar_cache_disk_errors_total", op="read") == 2
    # The third within the minute: the disk is failing, and bypassed.
    body, _ = await collect(rig.engine, rig.info, BLOCK, 2 * BLOCK + 99)
    assert body == data[BLOCK:2 * BLOCK + 100]
    assert rig.modes.current is Mode.BYPASS
    assert rig.modes.disk_problem is not None and "Input/output error" in rig.modes.disk_problem
    assert rig.metric("sidecar_cache_disk_errors_total", op="read") >= 3
    rig.store.disk_recovered()
    assert rig.store.read_fault() is None


async def test_invalidate_drops_the_blocks_and_forgets_their_read_ahead(
    make_rig: MakeRig
) -> None:
    data = random.Random(18).randbytes(10 * BLOCK)
    rig = await make_rig(data, planner=read_ahead_planner())
    reader = rig.engine.stream(rig.info, 0, len(data) - 1, lazy=True)
    got = 0
    async for piece, _ in reader:
        got += len(as_bytes(piece))
        if got >= 3 * BLOCK:
            break
    await reader.aclose()
    await rig.engine.idle()
    cached = rig.store.block_count()
    assert rig.engine.invalidate("b", "k") == cached > 0
    assert rig.store.block_count() == 0 and rig.engine.activity()["prefetch_pending"] == 0
    assert rig.store.lookup(BlockIdent("b", "k", rig.info.etag, 0), touch=False) is None


async def test_the_tally_says_how_each_block_was_found(make_rig: MakeRig) -> None:
    """What the access log's `blocks` and `lane` come from (sidecar/tally.py)."""
    data = random.Random(18).randbytes(4 * BLOCK)
    rig = await make_rig(data)

    async def read(start: int, end: int) -> ReadTally:
        tally = ReadTally()
        async for _ in rig.engine.stream(rig.info, start, end, lazy=False, tally=tally):
            pass
        return tally

    first = await read(BLOCK // 2, 2 * BLOCK - 1)  # a miss: blocks 0 and 1, one fetch
    assert (first.first_block, first.letters, first.lane) == (0, "ff", "foreground")
    await rig.engine.idle()
    rig.origin.delay = 0.05
    fetching, joining = await asyncio.gather(read(BLOCK, 4 * BLOCK - 1),
                                             read(2 * BLOCK, 4 * BLOCK - 1))
    assert fetching.letters == "cff" and fetching.first_block == 1
    assert joining.letters == "jj" and joining.lane == "foreground"
    await rig.engine.idle()
    cached = await read(0, 4 * BLOCK - 1)
    assert (cached.letters, cached.lane) == ("cccc", None)


async def test_blocks_of_a_requests_own_fetch_are_misses_even_once_landed(
    make_rig: MakeRig
) -> None:
    """A slow reader of a bounded range over missing blocks: its one fetch
    brings them all, and the later ones land before the reader comes to them.
    They are read from their slots, but their origin bytes are this request's:
    misses, fetched ('f'), their bytes the origin's, as a reader that kept up
    would have had them. Counting them as hits made the byte hit ratio depend
    on how fast the client read."""
    data = random.Random(19).randbytes(3 * BLOCK)
    rig = await make_rig(data)
    tally = ReadTally()
    stream = rig.engine.stream(rig.info, 0, len(data) - 1, lazy=False, tally=tally)
    piece, source = await asyncio.wait_for(anext(stream), timeout=5)
    body, sources = bytearray(as_bytes(piece)), {source}
    await rig.engine.idle()  # the whole run has landed meanwhile
    assert rig.store.block_count() == 3
    async for piece, source in stream:
        body += as_bytes(piece)
        sources.add(source)
    assert bytes(body) == data and sources == {Source.ORIGIN}
    assert (tally.letters, tally.origin_bytes) == ("fff", 3 * BLOCK)
    assert rig.metric("sidecar_cache_lookups_total", result="miss") == 3
    assert rig.metric("sidecar_cache_lookups_total", result="hit") == 0
    assert len(rig.origin.calls) == 1
    # Read again, every block is a hit.
    assert await collect(rig.engine, rig.info, 0, len(data) - 1) == (data, {Source.CACHE})


async def test_a_reader_waiting_as_its_chunk_lands_is_handed_it_in_memory(
    make_rig: MakeRig
) -> None:
    """The chunk a reader waits for is copied as it lands, into the store's
    recent-chunk memory; chunks nobody waits for are left to the slot."""
    block = 2 * 2**20  # two 1 MiB chunks
    data = random.Random(15).randbytes(block)
    rig = await make_rig(data, block=block)
    kept: list[int] = []
    keep_landed = rig.store.keep_landed

    def recording(write: Any, chunk: int, copy: memoryview) -> None:
        kept.append(chunk)
        keep_landed(write, chunk, copy)

    rig.store.keep_landed = recording  # type: ignore[method-assign]
    gate = asyncio.Event()
    real = rig.origin.fetch_into

    async def gated(info: ObjectInfo, start: int, end: int, lane: str, sink: Sink,
                    chunk_size: int, waited_for: bool = False) -> None:
        await gate.wait()
        await real(info, start, end, lane, sink, chunk_size)

    rig.origin.fetch_into = gated  # type: ignore[method-assign]
    reader = asyncio.create_task(collect(rig.engine, rig.info, 10, 99))
    # The fetch has begun: the reader, which started it, waits for chunk 0.
    await eventually_async(lambda: rig.origin.calls, "the block's fetch")
    gate.set()
    body, sources = await reader
    assert body == data[10:100] and sources == {Source.ORIGIN}
    await rig.engine.idle()
    assert kept == [0]
    # Once cached, the block is read from its slot: nothing more is copied.
    assert await collect(rig.engine, rig.info, 2**20, block - 1) == (data[2**20:],
                                                                    {Source.CACHE})
    assert kept == [0]


@pytest.mark.parametrize("mode", [Mode.CACHE_ONLY, Mode.BYPASS])
async def test_a_warm_up_waiting_for_its_slot_starts_no_origin_read_after_a_pause(
    make_rig: MakeRig, mode: Mode
) -> None:
    """A warm-up fetch waiting for a cache slot when the operator pauses
    downloads (or bypasses the cache) reads nothing from the origin once its
    slot comes: it used to go on with the GET the mode had paused."""
    rig = await make_rig(random.Random(23).randbytes(4 * BLOCK))
    waiting, release = asyncio.Event(), asyncio.Event()
    real_begin_write = rig.store.begin_write

    async def held_begin_write(ident: BlockIdent, length: int, *,
                               may_wait: bool = True) -> BlockWrite | None:
        waiting.set()
        await release.wait()
        return await real_begin_write(ident, length, may_wait=may_wait)

    rig.store.begin_write = held_begin_write  # type: ignore[method-assign]
    warm = asyncio.ensure_future(rig.engine.warm(rig.info, 0, BLOCK - 1, ttl_s=3600))
    async with asyncio.timeout(10):
        await waiting.wait()
    rig.modes.request(mode)
    release.set()
    result = await asyncio.wait_for(warm, 10)
    await rig.engine.idle()
    assert (result.fetched, result.failed) == (0, 1)
    assert rig.origin.calls == []
    assert rig.engine.activity()["buffered_bytes"] == 0


def hold_lane(rig: Rig, lane: str) -> tuple[asyncio.Event, list[int]]:
    """The origin reads of `lane` wait for the returned event (the list: the
    first byte of each read held so far); the others go on."""
    gate = asyncio.Event()
    held_reads: list[int] = []
    real = rig.origin.fetch_into

    async def held(info: ObjectInfo, start: int, end: int, lane_now: str, sink: Sink,
                   chunk_size: int, *, waited_for: bool = False) -> None:
        if lane_now == lane:
            held_reads.append(start)
            await gate.wait()
        await real(info, start, end, lane_now, sink, chunk_size)

    rig.origin.fetch_into = held  # type: ignore[method-assign]
    return gate, held_reads


async def test_warm_up_on_its_way_never_turns_a_reader_away(make_rig: MakeRig) -> None:
    """Warm-up blocks used to count toward max_buffered as readers' did: a
    warm call of four blocks past a bound of two made a reader's miss get
    503 SlowDown. Warm-up takes only the room readers leave, and waits for
    more; a reader is refused only for readers' own bytes."""
    rig = await make_rig(random.Random(31).randbytes(4 * BLOCK), max_buffered=2 * BLOCK)
    other_data = random.Random(32).randbytes(BLOCK)
    other = rig.origin.add("other", other_data)
    gate, held = hold_lane(rig, WARM)
    warm = asyncio.ensure_future(rig.engine.warm(rig.info, 0, 4 * BLOCK - 1, ttl_s=3600))
    await eventually_async(lambda: len(held) > 0, "a warm fetch at the origin")
    warm_on_their_way = rig.engine.activity()["buffered_bytes"]
    data, sources = await asyncio.wait_for(collect(rig.engine, other, 0, BLOCK - 1), 10)
    assert data == other_data and sources == {Source.ORIGIN}
    # The other two warm blocks wait for room: background bytes stay bounded.
    assert warm_on_their_way == 2 * BLOCK
    gate.set()
    result = await asyncio.wait_for(warm, 10)
    await rig.engine.idle()
    assert (result.fetched, result.failed) == (4, 0)
    assert rig.engine.activity()["buffered_bytes"] == 0


async def test_read_ahead_takes_only_the_room_readers_leave(make_rig: MakeRig) -> None:
    """A reader's block held at the origin takes a quarter of max_buffered: a
    broker reading another segment sequentially is still served, its
    read-ahead starting only while all blocks on their way fit in the bound.
    Read-ahead used to fill its window past it, and a reader's next miss got
    SlowDown. (The broker's own blocks count until they are on the disk: with
    the disk slow on a loaded machine, two of them may be, and a bound of three
    blocks then turned its next miss away, as it should.)"""
    data = random.Random(33).randbytes(12 * BLOCK)
    rig = await make_rig(data, max_buffered=4 * BLOCK, planner=read_ahead_planner())
    held_info = rig.origin.add("held", random.Random(34).randbytes(BLOCK))
    gate = asyncio.Event()
    held_fetched = asyncio.Event()
    real = rig.origin.fetch_into

    async def fetch_into(info: ObjectInfo, start: int, end: int, lane: str, sink: Sink,
                         chunk_size: int, *, waited_for: bool = False) -> None:
        if info.key == held_info.key:
            held_fetched.set()
            await gate.wait()
        await real(info, start, end, lane, sink, chunk_size)

    rig.origin.fetch_into = fetch_into  # type: ignore[method-assign]
    # Bytes on their way as each read-ahead block enters them. Counted there, not
    # as its origin read starts: by then a reader's next miss may have come in,
    # and readers are never held back by read-ahead (the total then passes the
    # bound by their blocks alone, as it may).
    fetches = rig.engine._fetches
    enter = fetches.enter
    ahead_entered: list[int] = []

    def entering(info: ObjectInfo, block: int, lane: str) -> InFlightBlock:
        in_flight = enter(info, block, lane)
        if lane == PREFETCH:
            ahead_entered.append(fetches.buffered_bytes)
        return in_flight

    fetches.enter = entering  # type: ignore[method-assign]
    held_reader = asyncio.ensure_future(collect(rig.engine, held_info, 0, BLOCK - 1))
    await asyncio.wait_for(held_fetched.wait(), 10)
    body = await asyncio.wait_for(read_like_a_broker(rig, rig.info, BLOCK // 4), 20)
    assert body == data
    assert ahead_entered  # read-ahead went on, in the room readers left
    assert max(ahead_entered) <= 4 * BLOCK
    gate.set()
    await asyncio.wait_for(held_reader, 10)
    await rig.engine.idle()
    assert rig.engine.activity()["buffered_bytes"] == 0
