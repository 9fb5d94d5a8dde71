"""The memory tier in the engine's path, over a real store (tests/unit/test_engine.py's
rig): chunks enter verified from the origin and from direct reads of the disk,
hits come out as pinned tier slices with the original bytes, a purge drops them."""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import random
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import ParamSpec, TypeVar

import pytest

from sidecar.cache.memory_tier import MemoryTier, TierSlice
from sidecar.engine import Piece, Source
from sidecar.model import ObjectInfo
from tests.support.waiting import eventually_async
from tests.unit import test_engine
from tests.unit.test_engine import BLOCK, MakeRig, Rig

make_rig = test_engine.make_rig  # the engine tests' rig, as a fixture of this module too

CHUNK = BLOCK  # blocks of 64 KiB are one chunk each

P = ParamSpec("P")
T = TypeVar("T")


class CountingExecutor(ThreadPoolExecutor):
    """The disk executor, counting the work handed to it."""

    submitted = 0

    def submit(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> Future[T]:
        self.submitted += 1
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
def executor() -> Iterator[CountingExecutor]:
    """The rig's disk executor (tests/conftest.py's), counting its work."""
    with CountingExecutor(max_workers=4, thread_name_prefix="test-io") as pool:
        yield pool


async def pieces_of(rig: Rig, info: ObjectInfo, start: int, end: int
                    ) -> list[tuple[Piece, Source]]:
    """Every piece of the range, kept as it came (tier slices stay pinned)."""
    return [piece async for piece in rig.engine.stream(info, start, end, lazy=False)]


async def read(rig: Rig, info: ObjectInfo, start: int, end: int) -> tuple[bytes, list[bool]]:
    """The range's bytes, each piece let go as it comes as the data port does,
    and which pieces came from the tier."""
    out, held = bytearray(), []
    async for piece, _ in rig.engine.stream(info, start, end, lazy=False):
        held.append(isinstance(piece, TierSlice))
        out += contents([(piece, Source.CACHE)])
    return bytes(out), held


async def sending_from_the_tier(make_rig: MakeRig, seed: int
                                ) -> tuple[Rig, bytes, MemoryTier, list[tuple[Piece, Source]]]:
    """Two blocks read into a tier that holds them, and a send of the first
    under way (its pieces kept: its tier slices stay pinned)."""
    data = random.Random(seed).randbytes(2 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=4 * CHUNK)
    await read(rig, rig.info, 0, len(data) - 1)
    await rig.engine.idle()
    tier = rig.store.tier
    assert tier is not None
    return rig, data, tier, await pieces_of(rig, rig.info, 0, BLOCK - 1)


def contents(pieces: list[tuple[Piece, Source]]) -> bytes:
    out = bytearray()
    for piece, _ in pieces:
        if isinstance(piece, TierSlice):
            out += os.pread(piece.file, piece.count, piece.offset)
            piece.release()
        else:
            out += piece
    return bytes(out)


async def test_origin_chunks_enter_the_tier_and_hits_are_sent_from_it(
        make_rig: MakeRig) -> None:
    data = random.Random(1).randbytes(4 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=8 * CHUNK)
    first = await pieces_of(rig, rig.info, 0, len(data) - 1)
    # A miss's reader takes each chunk from the tier as it lands.
    assert all(isinstance(piece, TierSlice) for piece, _ in first)
    assert contents(first) == data
    await rig.engine.idle()
    again = await pieces_of(rig, rig.info, 100, len(data) - 1)
    assert all(isinstance(piece, TierSlice) and source is Source.CACHE
               for piece, source in again)
    assert contents(again) == data[100:]
    assert len(rig.origin.calls) == 1  # one fetch, no second read of anything
    tier = rig.store.tier
    assert tier is not None and tier.counts.inserts == 4 and tier.counts.hits == 8


async def test_the_tier_taken_at_start_is_filled_and_read_as_before(
        make_rig: MakeRig) -> None:
    data = random.Random(5).randbytes(4 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=8 * CHUNK, reserve_tier=True)
    tier, reserving = rig.store.tier, rig.store.tier_reserve
    assert tier is not None and reserving is not None
    done = await reserving
    assert (done.bytes, done.error) == (8 * CHUNK, None)
    assert tier.resident_bytes() == 8 * CHUNK and tier.used_bytes() == 0
    assert (await read(rig, rig.info, 0, len(data) - 1))[0] == data
    await rig.engine.idle()
    assert await read(rig, rig.info, 10, len(data) - 1) == (data[10:], [True] * 4)
    assert tier.resident_bytes() == 8 * CHUNK  # the chunks went into the pages taken


async def test_without_the_reserve_the_tier_takes_pages_as_chunks_come(
        make_rig: MakeRig) -> None:
    data = random.Random(6).randbytes(2 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=8 * CHUNK)
    tier = rig.store.tier
    assert tier is not None and rig.store.tier_reserve is None
    assert tier.resident_bytes() == 0
    assert (await read(rig, rig.info, 0, len(data) - 1))[0] == data
    await rig.engine.idle()
    assert tier.resident_bytes() == 2 * CHUNK


async def test_a_verified_direct_read_of_the_disk_enters_the_tier(make_rig: MakeRig) -> None:
    """A tier of two chunks: the first two blocks fill it, the last two are
    declined as they land and at their first read (a full tier admits a chunk
    read a second time), so they are read from the slab (past the page cache,
    verified), and enter at the second."""
    data = random.Random(2).randbytes(4 * BLOCK)
    # No recent-chunk memory: the reads back come from the slab.
    rig = await make_rig(data, memory_tier_bytes=2 * CHUNK, direct_io=True,
                         recent_chunk_bytes=0)
    assert (await read(rig, rig.info, 0, len(data) - 1))[0] == data
    await rig.engine.idle()
    last = 3 * BLOCK
    assert await read(rig, rig.info, last, len(data) - 1) == (data[last:], [False])
    assert await read(rig, rig.info, last, len(data) - 1) == (data[last:], [False])
    assert await read(rig, rig.info, last, len(data) - 1) == (data[last:], [True])
    assert len(rig.origin.calls) == 1


async def test_a_full_tier_of_pinned_regions_costs_a_page_cache_read_no_executor_trip(
        make_rig: MakeRig, executor: CountingExecutor) -> None:
    """direct_io off: a chunk read through the page cache is verified on the
    loop; a tier that cannot take it (full, first offer; or every region
    being sent from) says so there, counted as before, and the read costs no
    trip to the executor. Once a region is free of sends, the chunk read
    again goes there and enters."""
    data = random.Random(8).randbytes(4 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=2 * CHUNK, direct_io=False,
                         recent_chunk_bytes=0)
    assert (await read(rig, rig.info, 0, len(data) - 1))[0] == data
    await rig.engine.idle()
    tier = rig.store.tier
    assert tier is not None
    sending = await pieces_of(rig, rig.info, 0, 2 * BLOCK - 1)  # both regions pinned
    assert all(isinstance(piece, TierSlice) for piece, _ in sending)
    at = 3 * BLOCK
    wanted = data[at:]
    declined, refused, trips = tier.counts.declined, tier.counts.refused, executor.submitted
    for _ in range(3):
        assert await read(rig, rig.info, at, len(data) - 1) == (wanted, [False])
        await rig.store.idle()
    # Declined at its first read, admitted but refused (no victim) at the next two.
    assert (tier.counts.declined - declined, tier.counts.refused - refused) == (1, 2)
    assert executor.submitted == trips
    assert contents(sending) == data[:2 * BLOCK]  # the sends let go
    assert await read(rig, rig.info, at, len(data) - 1) == (wanted, [False])
    await rig.store.idle()
    assert executor.submitted == trips + 1
    assert await read(rig, rig.info, at, len(data) - 1) == (wanted, [True])
    assert len(rig.origin.calls) == 1


@pytest.mark.parametrize("paged_out", [False, True], ids=["in-page-cache", "paged-out"])
async def test_without_direct_io_chunks_read_from_the_disk_enter_the_tier(
        make_rig: MakeRig, paged_out: bool) -> None:
    """direct_io off (an operator's choice, or a file system that refuses
    O_DIRECT): chunks read back through the page cache are offered to the tier
    as direct reads are, so a full tier still turns over to the chunks read
    again instead of keeping its first ones for good."""
    data = random.Random(2).randbytes(4 * BLOCK)
    # paged_out: the slab's pages dropped once written, so reads back go to
    # the executor; else they are read and verified on the loop.
    rig = await make_rig(data, memory_tier_bytes=2 * CHUNK, direct_io=False,
                         recent_chunk_bytes=0, drop_written_pages=paged_out)
    assert (await read(rig, rig.info, 0, len(data) - 1))[0] == data
    await rig.engine.idle()
    for block in (3, 2):
        at = block * BLOCK
        wanted = data[at:at + BLOCK]
        # Declined as it landed and at its first read back, admitted at the second.
        assert await read(rig, rig.info, at, at + BLOCK - 1) == (wanted, [False])
        await rig.store.idle()
        assert await read(rig, rig.info, at, at + BLOCK - 1) == (wanted, [False])
        await rig.store.idle()
        assert await read(rig, rig.info, at, at + BLOCK - 1) == (wanted, [True])
    tier = rig.store.tier
    assert tier is not None and tier.counts.evictions == 2
    assert len(rig.origin.calls) == 1


async def test_a_pinned_slice_keeps_its_bytes_while_the_tier_churns(
        make_rig: MakeRig) -> None:
    data = random.Random(3).randbytes(16 * BLOCK)
    # The slab's pages dropped once read: the reads back come past the page cache.
    rig = await make_rig(data, memory_tier_bytes=2 * CHUNK, direct_io=True,
                         recent_chunk_bytes=0, drop_written_pages=True)
    await pieces_of(rig, rig.info, 0, BLOCK - 1)  # block 0 into the tier, and sent
    await rig.engine.idle()
    held = await pieces_of(rig, rig.info, 0, BLOCK - 1)
    piece = held[0][0]
    assert isinstance(piece, TierSlice)
    # Other blocks pass through the tier of two regions many times over.
    for block in range(1, 16):
        # Declined as it lands and at its first read back from the slab,
        # admitted at the second.
        for _ in range(3):
            got = await read(rig, rig.info, block * BLOCK, (block + 1) * BLOCK - 1)
            assert got[0] == data[block * BLOCK:(block + 1) * BLOCK]
            await rig.engine.idle()  # cached (sealed) before it is read again
    await rig.engine.idle()
    tier = rig.store.tier
    assert tier is not None and tier.counts.evictions >= 10
    assert os.pread(piece.file, piece.count, piece.offset) == data[:BLOCK]
    piece.release()


async def test_a_purged_object_leaves_the_tier(make_rig: MakeRig) -> None:
    data = random.Random(4).randbytes(2 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=4 * CHUNK)
    await read(rig, rig.info, 0, len(data) - 1)
    await rig.engine.idle()
    tier = rig.store.tier
    assert tier is not None and tier.used_bytes() == len(data)
    sending = await pieces_of(rig, rig.info, 0, BLOCK - 1)  # a send under way
    rig.store.invalidate_object("b", "k")
    assert tier.used_bytes() == 0  # gone for lookups at once
    await rig.store.idle()  # its unpinned regions' pages punched out off the loop
    assert tier.resident_bytes() == BLOCK
    assert contents(sending) == data[:BLOCK]  # the send lets go of the purged region
    # Its punch is the disk executor's, not the event loop's: on the loop's
    # return from the release its pages are still there, and the region stays
    # out of use (held, never claimable) until they are out.
    assert tier.resident_bytes() == BLOCK and tier.held_bytes() == CHUNK
    await rig.store.idle()
    assert tier.resident_bytes() == 0 and tier.held_bytes() == 0
    assert (await read(rig, rig.info, 0, len(data) - 1))[0] == data
    assert len(rig.origin.calls) == 2


async def test_a_send_let_go_after_the_store_closed_releases_its_region_quietly(
        make_rig: MakeRig, executor: ThreadPoolExecutor,
        caplog: pytest.LogCaptureFixture) -> None:
    """A send of a purged region outlives the store (the listeners' last
    sends end as the node stops): letting go after the disk threads stopped
    logs nothing, and the tier's memory goes with that last hold."""
    rig, data, tier, sending = await sending_from_the_tier(make_rig, seed=7)
    rig.store.invalidate_object("b", "k")
    await rig.engine.close()
    await rig.store.close()
    executor.shutdown(wait=True)
    fd = tier.fd
    os.fstat(fd)  # the send still holds the memory file
    with caplog.at_level(logging.DEBUG):
        assert contents(sending) == data[:BLOCK]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert tier.fd == -1 and tier.resident_bytes() == 0
    with pytest.raises(OSError):
        os.fstat(fd)


async def test_regions_let_go_while_the_store_closes_are_not_punched_on_the_loop(
        make_rig: MakeRig, executor: CountingExecutor) -> None:
    """The store closes the tier only at the end of its close: a purge, and the
    end of a send of a purged region, in between had their pages punched out
    on the event loop (kernel work every request waited for) from a file about
    to go with its pages. They are let go unpunched, and the file still closes."""
    rig, data, tier, sending = await sending_from_the_tier(make_rig, seed=8)
    resident = tier.resident_bytes()
    assert resident == 2 * BLOCK
    await rig.engine.close()
    # Every disk thread held: the close waits on its index snapshot, its
    # tier not closed yet.
    gate, holding = threading.Event(), queue.Queue[None]()

    def hold() -> None:
        holding.put(None)
        gate.wait(30)

    held = [executor.submit(hold) for _ in range(4)]  # the fixture's max_workers
    try:
        await eventually_async(lambda: holding.qsize() == len(held), "every disk thread held")
        closing = asyncio.create_task(rig.store.close())
        await eventually_async(
            lambda: rig.store.close_step == "the index snapshot to be written to the cache disk",
            "the close to wait on its index snapshot")
        fd = tier.fd
        rig.store.invalidate_object("b", "k")
        assert tier.resident_bytes() == resident  # the unsent region: not punched
        assert contents(sending) == data[:BLOCK]  # the send lets go of its purged region
        assert tier.resident_bytes() == resident and tier.fd == fd
    finally:
        gate.set()
    await closing
    assert tier.fd == -1 and tier.resident_bytes() == 0
    with pytest.raises(OSError):
        os.fstat(fd)


async def test_a_consumer_resuming_in_its_own_chunks_leaves_a_full_tier_alone(
        make_rig: MakeRig) -> None:
    """A Kafka consumer through a tier smaller than what it reads: each fetch
    resumes in the chunk where its previous one ended, so it reads most chunks
    twice, which is no reuse: the full tier admits none and refills no region.
    Another consumer reading a chunk the first read lately is reuse: admitted."""
    data = random.Random(12).randbytes(12 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=2 * CHUNK, direct_io=True,
                         recent_chunk_bytes=0, planner=test_engine.read_ahead_planner())
    tier = rig.store.tier
    assert tier is not None
    start = 0
    while True:
        end = min(len(data), start + 3 * BLOCK // 2) - 1
        assert (await read(rig, rig.info, start, end))[0] == data[start:end + 1]
        await rig.engine.idle()
        if end == len(data) - 1:
            break
        start = end + 1 - BLOCK // 4  # the first batch not received whole
    assert tier.counts.declined > 0 and tier.counts.evictions == 0
    at = 10 * BLOCK  # where the first consumer's last fetches were
    other = data[at:at + BLOCK]
    assert await read(rig, rig.info, at, at + BLOCK - 1) == (other, [False])
    await rig.engine.idle()
    assert tier.counts.evictions == 1
    assert await read(rig, rig.info, at, at + BLOCK - 1) == (other, [True])


async def test_a_warm_up_of_blocks_on_the_disk_holds_them_in_the_tier_for_their_reader(
        make_rig: MakeRig) -> None:
    """A tier of four chunks, full with the first four blocks: the last four
    were declined as they landed. A warm-up of blocks 6 and 7, on the disk
    already, reads them into the tier, and the planned replay of them is sent
    from memory, with no origin read."""
    data = random.Random(13).randbytes(8 * BLOCK)
    rig = await make_rig(data, memory_tier_bytes=4 * CHUNK, direct_io=True,
                         recent_chunk_bytes=0)
    tier = rig.store.tier
    assert tier is not None
    assert (await read(rig, rig.info, 0, len(data) - 1))[0] == data
    await rig.engine.idle()
    assert tier.counts.inserts == 4 and tier.protected_bytes() == 0
    result = await rig.engine.warm(rig.info, 6 * BLOCK, 8 * BLOCK - 1, ttl_s=600)
    assert (result.already_cached, result.fetched) == (2, 0)
    assert tier.protected_bytes() == 2 * CHUNK
    assert await read(rig, rig.info, 6 * BLOCK, len(data) - 1) == (data[6 * BLOCK:],
                                                                  [True, True])
    assert tier.protected_bytes() == 0
    assert len(rig.origin.calls) == 1
