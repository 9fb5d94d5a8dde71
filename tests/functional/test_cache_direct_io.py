"""Cold blocks written past the page cache (O_DIRECT) on real file systems: an
ext4 on a loop device, which takes it, and a ramfs, which refuses it. Either
way every byte reads back exact and verified."""

from __future__ import annotations

import ctypes
import mmap
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from sidecar.aligned import page_aligned, page_aligned_buffer
from sidecar.cache import BlockStore
from sidecar.cache.errors import ChecksumMismatch
from sidecar.cache.ident import BlockIdent
from sidecar.cache.slab import NotResident, Slab
from sidecar.cache.slot_format import FILE_HEADER_SIZE, SLOT_HEADER_SIZE
from tests.support.cache_metrics import RecordingMetrics
from tests.support.counting_executor import CountingExecutor
from tests.support.loop_disk import LoopDisk, ensure_disk_tools, loop_disk

MiB = 1024 * 1024
BLOCK = 2 * MiB  # two 1 MiB chunks a block
IDENT = BlockIdent("bucket", "topic-0/0/00000000000000000000-seg.log", '"etag"', 0)


@pytest.fixture(scope="module", autouse=True)
def disk_tools() -> None:
    ensure_disk_tools()


@pytest.fixture
def ext4(tmp_path: Path) -> Iterator[LoopDisk]:
    with loop_disk(tmp_path, 64 * MiB) as disk:
        yield disk


@pytest.fixture
def ramfs(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "ram"
    mount.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "ramfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def aligned(data: bytes) -> memoryview:
    view = page_aligned_buffer(len(data))
    view[:] = data
    return view


def write_block(slab: Slab, slot: int, chunks: list[memoryview | bytes]) -> tuple[int, ...]:
    """The engine's way: chunk by chunk, then the header; the chunks' checksums."""
    checksums = tuple(
        slab.write_chunk(slot, number * MiB, memoryview(chunk), first=number == 0).checksum
        for number, chunk in enumerate(chunks))
    slab.seal(slot, IDENT, 1, sum(len(chunk) for chunk in chunks), checksums)
    return checksums


def resident(slab: Slab, slot: int, length: int, checksums: tuple[int, ...]) -> bool:
    """Whether the block's bytes are all in the page cache (a read that may not
    wait for the disk gets them)."""
    try:
        slab.read_checked(slot, 0, length, length, checksums, resident=True)
    except NotResident:
        return False
    return True


def test_whole_chunks_from_page_aligned_buffers_go_past_the_page_cache(ext4: LoopDisk) -> None:
    data = random.Random(1).randbytes(BLOCK)
    direct = Slab.open(ext4.mount / "direct", 2, BLOCK, direct_io=True)
    buffered = Slab.open(ext4.mount / "buffered", 2, BLOCK, direct_io=False)
    try:
        assert direct.direct_io and not buffered.direct_io
        chunks = [aligned(data[:MiB]), aligned(data[MiB:])]
        checksums = write_block(direct, 0, list(chunks))
        assert checksums == tuple(xxhash.xxh3_64_intdigest(data[at:at + MiB])
                                  for at in (0, MiB))
        assert write_block(buffered, 0, [aligned(data[:MiB]), aligned(data[MiB:])]) == checksums
        # The buffered slab's pages are in the page cache; the direct one's
        # went to the disk only, and are read from there, verified.
        assert resident(buffered, 0, BLOCK, checksums)
        assert not resident(direct, 0, BLOCK, checksums)
        assert bytes(direct.read_checked(0, 0, BLOCK, BLOCK, checksums)) == data
        # Written again in place (a slot reused), the new bytes are what is read.
        newer = random.Random(2).randbytes(BLOCK)
        newer_sums = write_block(direct, 0, [aligned(newer[:MiB]), aligned(newer[MiB:])])
        assert bytes(direct.read_checked(0, 0, BLOCK, BLOCK, newer_sums)) == newer
    finally:
        direct.close()
        buffered.close()


def test_short_chunks_and_unaligned_buffers_are_written_through_the_page_cache(
    ext4: LoopDisk
) -> None:
    data = random.Random(3).randbytes(MiB + 1000)  # a block's short last chunk
    slab = Slab.open(ext4.mount, 2, BLOCK, direct_io=True)
    try:
        assert slab.direct_io
        tail = write_block(slab, 0, [aligned(data[:MiB]), aligned(data[MiB:])])
        assert resident(slab, 0, len(data), tail) is False  # the first chunk is not
        assert slab.read_checked(0, MiB, len(data), len(data), tail, resident=True) \
            == data[MiB:]
        assert bytes(slab.read_checked(0, 0, len(data), len(data), tail)) == data
        # Whole chunks, but from read-only bytes and from a buffer one byte off
        # a page boundary: neither may go to O_DIRECT.
        whole = random.Random(4).randbytes(BLOCK)
        skewed = page_aligned_buffer(MiB + 1)[1:]
        skewed[:] = whole[MiB:]
        assert not page_aligned(skewed)
        sums = write_block(slab, 1, [whole[:MiB], skewed])
        assert resident(slab, 1, BLOCK, sums)
        assert bytes(slab.read_checked(1, 0, BLOCK, BLOCK, sums)) == whole
        # Chosen before the write, not learnt from a refused one.
        assert slab.direct_io
    finally:
        slab.close()


def test_a_file_system_that_refuses_o_direct_gets_buffered_writes(ramfs: Path) -> None:
    data = random.Random(5).randbytes(BLOCK)
    slab = Slab.open(ramfs, 2, BLOCK, direct_io=True)
    try:
        assert not slab.direct_io
        checksums = write_block(slab, 1, [aligned(data[:MiB]), aligned(data[MiB:])])
        assert bytes(slab.read_checked(1, 0, BLOCK, BLOCK, checksums)) == data
    finally:
        slab.close()
    # The slab kept the block like any other: reopened, its header describes it.
    reopened = Slab.open(ramfs, 2, BLOCK, direct_io=True)
    try:
        record = reopened.read_record(1)
        assert record is not None and record.ident == IDENT and record.checksums == checksums
    finally:
        reopened.close()



def test_a_run_of_chunks_is_read_past_the_page_cache_and_checked(ext4: LoopDisk) -> None:
    data = random.Random(6).randbytes(MiB + 1000)
    slab = Slab.open(ext4.mount, 2, BLOCK, direct_io=True)
    try:
        checksums = write_block(slab, 0, [aligned(data[:MiB]), aligned(data[MiB:])])
        views = slab.read_direct(0, 0, 2, len(data), checksums)
        assert [len(view) for view in views] == [MiB, 1000]
        assert b"".join(views) == data
        # Each chunk in a page-aligned buffer of its own, and nothing of the
        # block in the page cache afterwards.
        assert all(page_aligned(view) for view in views)
        assert views[0].obj is not views[1].obj
        assert not resident(slab, 0, MiB, checksums[:1])
        # A byte changed on the disk behind the slab's back fails its chunk.
        with open(ext4.mount / "slab.dat", "r+b") as handle:
            handle.seek(4096 + 4096 + MiB + 10)
            handle.write(bytes([data[MiB + 10] ^ 0xFF]))
        assert bytes(slab.read_direct(0, 0, 1, len(data), checksums)[0]) == data[:MiB]
        with pytest.raises(ChecksumMismatch) as failed:
            slab.read_direct(0, 0, 2, len(data), checksums)
        assert failed.value.chunk == 1
    finally:
        slab.close()


def test_without_o_direct_a_run_of_chunks_is_read_through_the_page_cache(ramfs: Path) -> None:
    data = random.Random(7).randbytes(BLOCK)
    slab = Slab.open(ramfs, 2, BLOCK, direct_io=True)
    try:
        checksums = write_block(slab, 0, [aligned(data[:MiB]), aligned(data[MiB:])])
        assert b"".join(slab.read_direct(0, 0, 2, BLOCK, checksums)) == data
    finally:
        slab.close()


async def test_the_store_reads_a_block_written_past_the_page_cache_four_chunks_a_trip(
    ext4: LoopDisk
) -> None:
    """The engine's way in: slot reserved, chunks landed from page-aligned
    buffers, committed; then a reader's fetches, one chunk at a time."""
    block = 8 * MiB
    data = random.Random(8).randbytes(6 * MiB + 100)  # seven chunks, the last short
    with CountingExecutor() as executor:
        store = await BlockStore.open(ext4.mount, 4 * (block + 4096), block, executor,
                                      RecordingMetrics(), drop_written_pages=True,
                                      direct_io=True)
        try:
            write = await store.begin_write(IDENT, len(data))
            assert write is not None
            for at in range(0, len(data), MiB):
                chunk = aligned(data[at:at + MiB])
                write.checksums[at // MiB] = store.write_chunk(write, at, chunk)
            record = (await store.commit(write, read=False)).record
            assert record is not None
            await store.idle()  # the short last chunk's pages written back
            # Nothing of the block went through the page cache.
            assert resident_pages(ext4.mount, record.slot, 0, len(data), block=block) == 0
            # A bounded read of one chunk reads that chunk only.
            trips = executor.submitted
            piece = await store.read(record, 2 * MiB + 5, 2 * MiB + 99, through=2 * MiB + 99)
            assert piece is not None and bytes(piece) == data[2 * MiB + 5:2 * MiB + 99]
            assert executor.submitted - trips == 1
            # A read on to the end of the block, a chunk a piece as the engine
            # serves it: chunks 0-3 in one trip, 4-6 in another.
            trips = executor.submitted
            for at in range(0, len(data), MiB):
                piece = await store.read(record, at + 5, min(at + MiB, len(data)),
                                         through=len(data))
                assert piece is not None and bytes(piece) == data[at + 5:at + MiB]
            assert executor.submitted - trips == 2
        finally:
            await store.close()


async def test_a_chunk_kept_as_it_landed_is_served_from_memory(ext4: LoopDisk) -> None:
    """A landing chunk copied for the reader waiting for it (the engine's
    `keep_landed`) is read with no trip to the disk, and is a copy: the fetch
    reuses its receive buffer at once."""
    data = random.Random(15).randbytes(2 * MiB)
    with CountingExecutor() as executor:
        store = await BlockStore.open(ext4.mount, 4 * (BLOCK + 4096), BLOCK, executor,
                                      RecordingMetrics(), direct_io=True)
        try:
            write = await store.begin_write(IDENT, len(data))
            assert write is not None
            for at in (0, MiB):
                received = aligned(data[at:at + MiB])
                write.checksums[at // MiB] = store.write_chunk(write, at, received)
                if at == 0:
                    copy = store.landed_copy(received)
                    assert copy is not None
                    store.keep_landed(write, 0, copy)
                received[:] = bytes(MiB)  # the receive buffer, reused
            trips = executor.submitted
            piece = await store.read_landed(write, 7, MiB, through=MiB)
            assert bytes(piece) == data[7:MiB]
            assert executor.submitted == trips
            # The chunk nobody waited for is read from the disk, verified.
            piece = await store.read_landed(write, MiB + 7, 2 * MiB, through=2 * MiB)
            assert bytes(piece) == data[MiB + 7:]
            assert executor.submitted == trips + 1
        finally:
            await store.close()


async def test_a_block_written_past_the_page_cache_leaves_no_page_there_to_write_back(
    ext4: LoopDisk, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reader going past a block a fetch wrote past the page cache costs no
    trip to the disk threads (a warm replay goes past every block it reads).
    A block whose short last chunk went through the page cache has that
    chunk's pages written back and dropped as it is committed: it is read
    past the page cache too, so they would serve no one there."""
    written_back: list[int] = []
    real = Slab.write_back

    def counted(self: Slab, slot: int) -> None:
        written_back.append(slot)
        real(self, slot)

    monkeypatch.setattr(Slab, "write_back", counted)
    whole = random.Random(16).randbytes(BLOCK)
    short = random.Random(17).randbytes(MiB + 4096 + 100)
    with CountingExecutor() as executor:
        store = await BlockStore.open(ext4.mount, 4 * (BLOCK + 4096), BLOCK, executor,
                                      RecordingMetrics(), drop_written_pages=True,
                                      direct_io=True)
        try:
            slots = []
            for block, data in enumerate((whole, short)):
                write = await store.begin_write(IDENT._replace(block=block), len(data))
                assert write is not None
                for at in range(0, len(data), MiB):
                    write.checksums[at // MiB] = store.write_chunk(
                        write, at, aligned(data[at:at + MiB]))
                if block == 1:  # the short chunk went (in part) through the page cache
                    assert resident_pages(ext4.mount, write.slot, MiB, 4096 + 100) > 0
                record = (await store.commit(write, read=False)).record
                assert record is not None
                slots.append(record.slot)
                await store.idle()
            assert written_back == [slots[1]]
            assert resident_pages(ext4.mount, slots[1], MiB, 4096 + 100) == 0
            trips = executor.submitted
            for block in (0, 1, 0, 1):
                store.release_pages(IDENT._replace(block=block))
            await store.idle()
            assert executor.submitted == trips and written_back == [slots[1]]
        finally:
            await store.close()


def resident_pages(directory: Path, slot: int, at: int, length: int, block: int = BLOCK) -> int:
    """How many pages of bytes [at, at + length) of the slot's data are in the
    page cache: mincore(2) on a mapping of them, which reads nothing in (a
    read that may not wait starts the kernel's read-ahead)."""
    offset = FILE_HEADER_SIZE + slot * (SLOT_HEADER_SIZE + block) + SLOT_HEADER_SIZE + at
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    pages = (ctypes.c_ubyte * -(-length // mmap.PAGESIZE))()
    fd = os.open(directory / "slab.dat", os.O_RDONLY)
    try:
        address = libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
        assert address not in (None, ctypes.c_void_p(-1).value), os.strerror(ctypes.get_errno())
        try:
            assert libc.mincore(address, length, pages) == 0, os.strerror(ctypes.get_errno())
        finally:
            libc.munmap(address, length)
    finally:
        os.close(fd)
    return sum(page & 1 for page in pages)
