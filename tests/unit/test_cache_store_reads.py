"""How the store reads cached bytes: chunks a reader had are served again from
memory, chunks in the page cache are read on the event loop, the rest in the
executor; each is verified against its checksum either way."""

from __future__ import annotations

import errno
import os
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from sidecar.cache import BlockIdent, BlockStore, SlotRecord
from sidecar.cache.slab import NotResident, Slab
from tests.support.cache_metrics import RecordingMetrics
from tests.support.counting_executor import CountingExecutor

# Two 1 MiB chunks a block (a chunk is at most 1 MiB), so a range can lie in
# one chunk or span both.
BLOCK = 2 * 1024 * 1024
CHUNK = 1024 * 1024


@pytest.fixture
def counting() -> Any:
    with CountingExecutor() as pool:
        yield pool


def ident(block: int = 0, key: str = "obj") -> BlockIdent:
    return BlockIdent("bkt", key, "e1", block)


def payload(seed: int) -> bytes:
    return random.Random(seed).randbytes(BLOCK)


async def stored(tmp_path: Path, executor: ThreadPoolExecutor) -> BlockStore:
    return await BlockStore.open(tmp_path, 4 * (BLOCK + 4096), BLOCK, executor,
                                 RecordingMetrics(), preallocate=False)


async def written(store: BlockStore, block: BlockIdent, data: bytes) -> SlotRecord:
    record = (await store.write(block, data)).record
    assert record is not None
    return record


def count_slab_reads(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every Slab.read_checked call, as whether it asked for resident bytes only."""
    calls: list[bool] = []
    real = Slab.read_checked

    def counted(self: Slab, *args: Any, resident: bool = False) -> Any:
        calls.append(resident)
        return real(self, *args, resident=resident)

    monkeypatch.setattr(Slab, "read_checked", counted)
    return calls


async def test_a_chunk_a_reader_had_is_served_again_without_the_slab(
    tmp_path: Path, executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await stored(tmp_path, executor)
    try:
        data = payload(1)
        record = await written(store, ident(), data)
        reads = count_slab_reads(monkeypatch)
        # The end of one fetch and the start of the next, inside one chunk.
        assert await store.read(record, 1000, 5000) == data[1000:5000]
        assert await store.read(record, 5000, CHUNK) == data[5000:CHUNK]
        assert len(reads) == 1
        # The other chunk is read (once) when it is asked for.
        assert await store.read(record, CHUNK + 10, BLOCK) == data[CHUNK + 10:]
        assert await store.read(record, CHUNK, CHUNK + 10) == data[CHUNK:CHUNK + 10]
        assert len(reads) == 2
    finally:
        await store.close()


async def test_a_block_written_again_is_never_served_from_the_older_copy(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    store = await stored(tmp_path, executor)
    try:
        first = await written(store, ident(), payload(1))
        assert await store.read(first, 0, 100) == payload(1)[:100]
        second = await written(store, ident(), payload(2))
        assert await store.read(second, 0, 100) == payload(2)[:100]
    finally:
        await store.close()


async def test_an_invalidated_object_leaves_nothing_in_memory(
    tmp_path: Path, executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await stored(tmp_path, executor)
    try:
        record = await written(store, ident(), payload(1))
        assert await store.read(record, 0, 100) == payload(1)[:100]
        store.invalidate_object("bkt", "obj")
        again = await written(store, ident(), payload(1))
        reads = count_slab_reads(monkeypatch)
        assert await store.read(again, 0, 100) == payload(1)[:100]
        assert reads, "the bytes came from memory after the object was invalidated"
    finally:
        await store.close()


async def test_resident_chunks_are_read_on_the_loop_and_the_rest_in_the_executor(
    tmp_path: Path, counting: CountingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await stored(tmp_path, counting)
    try:
        data = payload(3)
        record = await written(store, ident(), data)
        reads = count_slab_reads(monkeypatch)
        before = counting.submitted
        assert await store.read(record, 0, 10) == data[:10]  # just written: in the page cache
        assert reads == [True] and counting.submitted == before

        # The second chunk's pages written to the disk and dropped from the page
        # cache, as drop_written_pages does after a reader went past them.
        drop_cache(tmp_path)
        assert await store.read(record, CHUNK, BLOCK) == data[CHUNK:]
        assert reads[1] is True, "a resident read was tried first"
        assert counting.submitted > before, "the bytes on the disk were read in the executor"
    finally:
        await store.close()


async def test_bytes_damaged_on_the_disk_fail_on_the_loop_as_in_the_executor(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    metrics = RecordingMetrics()
    store = await BlockStore.open(tmp_path, 4 * (BLOCK + 4096), BLOCK, executor, metrics,
                                  preallocate=False)
    try:
        record = await written(store, ident(), payload(4))
        with (tmp_path / "slab.dat").open("r+b") as handle:
            handle.seek(4096 + record.slot * (BLOCK + 4096) + 4096 + 7)  # in chunk 0
            handle.write(b"\xff\x00\xff")
        assert await store.read(record, 0, 100) is None  # dropped, to be fetched again
        assert metrics.checksum_failures == 1
        assert store.lookup(ident()) is None
    finally:
        await store.close()


def test_a_read_of_bytes_not_in_the_page_cache_says_so(tmp_path: Path) -> None:
    slab = Slab.open(tmp_path, slot_count=2, block_size=BLOCK, preallocate=False)
    try:
        checksum = slab.write_chunk(0, 0, memoryview(payload(5)[:CHUNK]), first=True).checksum
        drop_cache(tmp_path)
        with pytest.raises(NotResident):
            slab.read_checked(0, 0, CHUNK, BLOCK, [checksum, None], resident=True)
        assert slab.read_checked(0, 0, CHUNK, BLOCK, [checksum, None]) == payload(5)[:CHUNK]
    finally:
        slab.close()


def drop_cache(directory: Path) -> None:
    fd = os.open(directory / "slab.dat", os.O_RDWR)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def test_a_block_whose_pages_were_dropped_is_read_in_the_executor_at_once(
    tmp_path: Path, counting: CountingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No try on the loop that would only start the kernel's read-ahead there."""
    store = await BlockStore.open(tmp_path, 4 * (BLOCK + 4096), BLOCK, counting,
                                  RecordingMetrics(), preallocate=False, drop_written_pages=True)
    try:
        data = payload(6)
        record = await written(store, ident(), data)
        store.release_pages(ident())  # a reader went past it
        await store.idle()
        reads = count_slab_reads(monkeypatch)
        before = counting.submitted
        assert await store.read(record, 0, 100) == data[:100]
        assert reads == [False] and counting.submitted == before + 1
        # Read in again (and the rest of the block read ahead): the next chunk
        # is tried on the loop first.
        assert await store.read(record, CHUNK, CHUNK + 100) == data[CHUNK:CHUNK + 100]
        assert reads[1] is True
    finally:
        await store.close()


async def test_a_block_s_pages_are_written_back_once(
    tmp_path: Path, counting: CountingExecutor
) -> None:
    """A reader going past a block sends the disk threads to write its pages
    back and drop them; the next reader past it finds them out already. (The
    blocks a fetch wrote past the page cache: tests/functional/test_cache_direct_io.py.)"""
    store = await BlockStore.open(tmp_path, 4 * (BLOCK + 4096), BLOCK, counting,
                                  RecordingMetrics(), preallocate=False,
                                  drop_written_pages=True)
    try:
        await written(store, ident(), payload(8))
        await store.idle()
        trips = []
        for _ in range(2):
            before = counting.submitted
            store.release_pages(ident())
            await store.idle()
            trips.append(counting.submitted - before)
        assert trips == [1, 0]
    finally:
        await store.close()


async def test_a_kernel_without_nowait_reads_reads_in_the_executor_and_drops_nothing(
    tmp_path: Path, counting: CountingExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kernels before 4.14 and some file systems refuse RWF_NOWAIT itself."""
    metrics = RecordingMetrics()
    store = await BlockStore.open(tmp_path, 4 * (BLOCK + 4096), BLOCK, counting, metrics,
                                  preallocate=False, recent_chunk_bytes=0)
    try:
        data = payload(7)
        record = await written(store, ident(), data)
        refused: list[int] = []

        def no_nowait(fd: int, buffers: Any, offset: int, flags: int = 0) -> int:
            refused.append(flags)
            raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

        monkeypatch.setattr(os, "preadv", no_nowait)
        before = counting.submitted
        assert await store.read(record, 0, 100) == data[:100]
        assert await store.read(record, CHUNK, CHUNK + 100) == data[CHUNK:CHUNK + 100]
        assert len(refused) == 1, "asked once, then no more"
        assert counting.submitted == before + 2
        assert metrics.checksum_failures == 0 and store.lookup(ident()) == record
    finally:
        await store.close()


async def tiered(tmp_path: Path, executor: ThreadPoolExecutor, metrics: Any = None,
                 tier_chunks: int = 8) -> BlockStore:
    """A store of four blocks (two chunks each) with a memory tier."""
    return await BlockStore.open(tmp_path, 4 * (BLOCK + 4096), BLOCK, executor,
                                 metrics or RecordingMetrics(), preallocate=False,
                                 memory_tier_bytes=tier_chunks * CHUNK)


def tier_bytes(store: BlockStore, block: BlockIdent, record: SlotRecord, chunk: int) -> bytes:
    piece = store.tier_slice(block, record.generation, chunk * CHUNK, (chunk + 1) * CHUNK)
    assert piece is not None, f"chunk {chunk} is not in the tier"
    try:
        return bytes(piece.view())
    finally:
        piece.release()


async def test_a_lift_reads_a_cached_block_into_the_tier_and_holds_it_until_read(
    tmp_path: Path, counting: CountingExecutor
) -> None:
    """A warm-up of a block the disk holds: its chunks read from the slab,
    verified, into the tier, protected there until read; a second lift reads
    nothing."""
    store = await tiered(tmp_path, counting)
    try:
        tier = store.tier
        assert tier is not None
        data = payload(20)
        record = await written(store, ident(), data)
        assert tier.used_bytes() == 0  # a write fills the slab only
        assert await store.lift(ident()) == 2
        assert tier.protected_bytes() == BLOCK
        before = counting.submitted
        assert await store.lift(ident()) == 2
        assert counting.submitted == before, "held already: protected again, nothing read"
        assert tier_bytes(store, ident(), record, 0) == data[:CHUNK]
        assert tier.protected_bytes() == CHUNK  # the chunk read is no longer held
        assert tier_bytes(store, ident(), record, 1) == data[CHUNK:]
        assert tier.protected_bytes() == 0
        assert await store.lift(ident(1)) == 0  # not cached: nothing to lift
    finally:
        await store.close()


async def test_a_lift_stops_at_the_tiers_protected_share(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """Half of a tier of four chunks may be protected: a warm-up of two cached
    blocks lifts the first and reads nothing of the second, which would only
    push the first out again."""
    store = await tiered(tmp_path, executor, tier_chunks=4)
    try:
        tier = store.tier
        assert tier is not None
        for block in (0, 1):
            await written(store, ident(block), payload(30 + block))
        assert await store.lift(ident(0)) == 2
        assert tier.protectable_chunks() == 0
        assert await store.lift(ident(1)) == 0
        assert tier.used_bytes() == BLOCK and tier.counts.inserts == 2
    finally:
        await store.close()


async def test_a_lift_of_bytes_damaged_on_the_disk_drops_the_block(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    metrics = RecordingMetrics()
    store = await tiered(tmp_path, executor, metrics)
    try:
        tier = store.tier
        assert tier is not None
        record = await written(store, ident(), payload(40))
        with (tmp_path / "slab.dat").open("r+b") as handle:
            handle.seek(4096 + record.slot * (BLOCK + 4096) + 4096 + CHUNK + 7)  # chunk 1
            handle.write(b"\xff\x00\xff")
        assert await store.lift(ident()) == 0
        assert metrics.checksum_failures == 1
        assert store.lookup(ident()) is None  # dropped, to be fetched again
        assert tier.used_bytes() == 0  # no chunk of a block that failed went in
    finally:
        await store.close()
