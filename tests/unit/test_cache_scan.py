"""Serving while the start's scan runs: the merge of scanned batches into the
live index (pure), and a store whose scan is held part-way by a test's gate.
"""

from __future__ import annotations

import asyncio
import os
from array import array
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sidecar.cache import BlockIdent, BlockStore
from sidecar.cache.header_scan import MAX_UNREADABLE_HEADERS, scan_headers
from sidecar.cache.index import SlotIndex, ident_hash
from sidecar.cache.recovery import ScanMerge
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.cache.slot_format import SlotScan, generation_of
from tests.support.cache_metrics import RecordingMetrics

# The identity key of every index here (sidecar.cache.index, "Identity hash").
KEY = bytes(range(16))

BLOCK = 64 * 1024
SLOT = BLOCK + 4096
EPOCH = 3
FIRST = generation_of(EPOCH, 1)  # the first generation of this start


def ident(n: int) -> BlockIdent:
    return BlockIdent("tiered", f"topic-abc/0/{n:020d}.log", '"e1"', 0)


def batch(*entries: tuple[int, BlockIdent, int], empty: tuple[int, ...] = (),
          corrupt: tuple[int, ...] = ()) -> SlotScan:
    """A scanned batch: (slot, block, generation) for each valid header."""
    found = SlotScan(array("I"), array("Q"), array("I"), bytearray(), array("Q"),
                     bytearray(), list(corrupt), array("I", empty))
    for slot, block, generation in entries:
        found.slots.append(slot)
        found.generations.append(generation)
        found.lengths.append(100)
        found.hashes.extend(ident_hash(block, KEY))
        found.checksums.append(slot)  # one 4096-byte chunk
        found.main.append(0)
    return found


class Live:
    """An index and policy as the store holds them, with the store's part of
    the merge: writes since the start and drops of recovered blocks."""

    def __init__(self, slots: int = 16) -> None:
        self.index = SlotIndex(slots, 4096, 4096, KEY)
        self.policy = SlotFifo(slots, self.index.fingerprint_of)
        self.merge = ScanMerge(self.index, self.policy, FIRST)
        self.dropped: list[int] = []

    def write(self, slot: int, block: BlockIdent, generation: int) -> None:
        self.policy.insert(slot, 0)
        self.index.add(slot, ident_hash(block, KEY), 100, generation, (slot,))
        self.merge.written(slot, generation)

    def drop(self, slot: int) -> None:
        self.index.remove(slot)
        self.policy.remove(slot)
        self.dropped.append(slot)


def test_a_scanned_copy_of_a_block_written_since_the_start_yields() -> None:
    live = Live()
    live.write(5, ident(1), FIRST + 2)
    merged = live.merge.merge(batch((2, ident(1), generation_of(EPOCH - 1, 900)),
                                    (3, ident(2), generation_of(EPOCH - 1, 7)),
                                    empty=(0, 1), corrupt=(4,)), 5, live.drop)
    assert live.index.find(ident_hash(ident(1), KEY)) == 5
    assert live.index.find(ident_hash(ident(2), KEY)) == 3
    # The scanned copy is erased before its slot is free, like the corrupt one.
    assert merged.erase == [4, 2] and merged.free == [0, 1] and live.dropped == []
    assert (live.merge.blocks_recovered, live.merge.duplicates,
            live.merge.corrupt_headers, live.merge.slots_scanned) == (1, 1, 1, 5)
    assert live.merge.generation(5) == FIRST + 2
    assert live.merge.generation(3) == generation_of(EPOCH - 1, 7)


def test_even_the_largest_generation_on_disk_is_below_this_starts() -> None:
    # Whatever the scan has not seen yet, the epoch makes a write of this
    # start the newer copy: the rule is the generations', not a special case.
    live = Live()
    live.write(9, ident(1), FIRST)
    largest = generation_of(EPOCH - 1, (1 << 40) - 1)
    merged = live.merge.merge(batch((0, ident(1), largest)), 1, live.drop)
    assert largest < FIRST and merged.erase == [0]
    assert live.index.find(ident_hash(ident(1), KEY)) == 9


def test_a_newer_copy_in_a_later_batch_displaces_a_recovered_one() -> None:
    live = Live()
    live.merge.merge(batch((0, ident(1), generation_of(1, 5)), (1, ident(2), 6)), 4,
                     live.drop)
    assert live.merge.blocks_recovered == 2
    merged = live.merge.merge(batch((6, ident(1), generation_of(2, 1))), 4, live.drop)
    # Recovered and visible (it may be being read): the store drops it, and
    # erases it on disk once nobody reads it.
    assert live.dropped == [0] and merged.erase == []
    assert live.index.find(ident_hash(ident(1), KEY)) == 6
    assert (live.merge.blocks_recovered, live.merge.duplicates) == (2, 1)
    assert live.index.used_bytes == 200
    # An older copy in a later batch is the one that goes.
    merged = live.merge.merge(batch((7, ident(2), 4)), 4, live.drop)
    assert merged.erase == [7] and live.index.find(ident_hash(ident(2), KEY)) == 1
    assert (live.merge.blocks_recovered, live.merge.duplicates) == (2, 2)


def test_scanned_blocks_queue_behind_those_written_since_the_start() -> None:
    live = Live()
    live.write(8, ident(10), FIRST)
    live.merge.merge(batch((0, ident(1), 30), (1, ident(2), 10), (2, ident(3), 20)), 3,
                     live.drop)
    live.merge.merge(batch((3, ident(4), 5)), 1, live.drop)
    # Next out first: each batch oldest first, behind what this start wrote.
    assert live.policy.queue("small") == [3, 1, 2, 0, 8]


def test_a_slot_indexed_before_the_scan_reached_it_is_a_bug_not_a_merge() -> None:
    live = Live()
    live.write(0, ident(1), FIRST)
    with pytest.raises(ValueError):
        live.merge.merge(batch((0, ident(2), 5)), 1, live.drop)


class Gate:
    """The store's scan_pause: holds the scan once ``at`` slots are scanned,
    until released."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.reached = asyncio.Event()
        self.released = asyncio.Event()

    async def __call__(self, scanned: int) -> None:
        if scanned >= self.at and not self.released.is_set():
            self.reached.set()
            await self.released.wait()


def data(n: int) -> bytes:
    return bytes([n]) * (BLOCK - n)


async def crashed_cache(directory: Path, executor: ThreadPoolExecutor) -> None:
    """16 slots: blocks 0..9 in slots 0..9 but block 1 (dropped: slot 1 is
    empty on disk), slots 10..15 empty; left as a kill -9 leaves it (no index
    snapshot)."""
    store = await BlockStore.open(directory, 16 * SLOT, BLOCK, executor, RecordingMetrics())
    for n in range(10):
        assert (await store.write(ident(n), data(n))).record is not None
    store.invalidate_object("tiered", ident(1).key)
    await store.close()
    (directory / "index.snap").unlink()


async def reopen(directory: Path, executor: ThreadPoolExecutor, gate: Gate | None,
                 metrics: RecordingMetrics) -> BlockStore:
    return await BlockStore.open(directory, 16 * SLOT, BLOCK, executor, metrics,
                                 scan_batch=4, scan_pause=gate)


async def test_the_store_serves_while_the_scan_runs(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    await crashed_cache(tmp_path, executor)
    gate, metrics = Gate(at=4), RecordingMetrics()
    store = await reopen(tmp_path, executor, gate, metrics)
    try:
        await gate.reached.wait()
        # Slots 0..3 are scanned: blocks 0, 2 and 3 indexed, slot 1 free.
        stats = store.recovery_stats()
        assert stats is not None
        assert (stats["scanning"], stats["slots_scanned"], stats["slots_to_scan"],
                stats["blocks_recovered"], stats["scan_seconds"]) == (True, 4, 16, 3, None)
        assert store.scanning and store.block_count() == 3
        record = store.lookup(ident(2))
        assert record is not None and await store.read(record, 0, BLOCK - 2) == data(2)
        # Block 7 is on disk, but not scanned yet: a miss.
        assert store.lookup(ident(7)) is None
        # Its fetch caches it again, in the one slot found free so far.
        written = await store.write(ident(7), data(7))
        assert written.record is not None and written.record.slot == 1
        assert await store.read(written.record, 0, BLOCK - 7) == data(7)
        # No slot left: served uncached (nothing evicted to make room while
        # unscanned slots may be empty).
        assert (await store.write(ident(20), data(20))).record is None
        assert store.block_count() == 4 and metrics.evictions == {}

        gate.released.set()
        await store.scanned()
        assert not store.scanning
        stats = store.recovery_stats()
        assert stats is not None
        # Block 7's scanned copy (slot 7) yielded to the one written since.
        assert (stats["scanning"], stats["slots_scanned"], stats["blocks_recovered"],
                stats["duplicates"], stats["corrupt_headers"]) == (False, 16, 8, 1, 0)
        assert stats["scan_seconds"] is not None and stats["scan_seconds"] >= 0
        assert metrics.evictions == {"recovery": 1}
        for n in (0, *range(2, 10)):
            record = store.lookup(ident(n))
            assert record is not None, n
            assert await store.read(record, 0, BLOCK - n) == data(n)
        assert store.lookup(ident(7)) == written.record
        await store.idle()  # the erasure of slot 7, then it is free
        assert (await store.write(ident(20), data(20))).record is not None
    finally:
        gate.released.set()
        await store.close()


async def test_a_stop_during_the_scan_saves_no_snapshot_and_loses_nothing(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    await crashed_cache(tmp_path, executor)
    gate = Gate(at=4)
    store = await reopen(tmp_path, executor, gate, RecordingMetrics())
    await gate.reached.wait()
    written = await store.write(ident(7), data(7))
    assert written.record is not None and written.record.slot == 1
    # The gate is never released: the stop cancels the scan, it does not wait for it.
    await asyncio.wait_for(store.close(), timeout=30)
    assert not (tmp_path / "index.snap").exists()

    metrics = RecordingMetrics()
    store = await reopen(tmp_path, executor, None, metrics)
    try:
        await store.scanned()
        assert store.recovery is not None and store.recovery.index == "scan"
        for n in (0, *range(2, 10)):
            record = store.lookup(ident(n))
            assert record is not None, n
            assert await store.read(record, 0, BLOCK - n) == data(n)
        # Both copies of block 7 were still on disk; the one written during
        # the last scan has the later epoch and wins.
        record = store.lookup(ident(7))
        assert record is not None and record.slot == 1
        assert (store.recovery.blocks_recovered, store.recovery.duplicates) == (9, 1)
        assert metrics.evictions == {"recovery": 1}
    finally:
        await store.close()
    # This one finished its scan: its stop saved the index.
    assert (tmp_path / "index.snap").exists()


async def test_an_object_dropped_during_the_scan_does_not_come_back_from_it(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    await crashed_cache(tmp_path, executor)
    gate, metrics = Gate(at=4), RecordingMetrics()
    store = await reopen(tmp_path, executor, gate, metrics)
    try:
        await gate.reached.wait()
        assert store.lookup(ident(2)) is not None
        # Block 2 is indexed, block 8 still only on disk, not scanned yet.
        assert store.invalidate_object("tiered", ident(2).key).blocks == 1
        assert store.invalidate_object("tiered", ident(8).key).blocks == 0
        gate.released.set()
        await store.scanned()
        assert store.lookup(ident(2)) is None and store.lookup(ident(8)) is None
        assert store.lookup(ident(9)) is not None
        assert metrics.evictions == {"invalidated": 2}
    finally:
        gate.released.set()
        await store.close()
    # Erased on disk too: the next scan does not find block 8 either.
    (tmp_path / "index.snap").unlink()
    store = await reopen(tmp_path, executor, None, RecordingMetrics())
    try:
        await store.scanned()
        assert store.lookup(ident(8)) is None and store.lookup(ident(9)) is not None
    finally:
        await store.close()


async def test_the_scrub_starts_once_the_scan_is_done(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    await crashed_cache(tmp_path, executor)
    gate = Gate(at=4)
    store = await BlockStore.open(tmp_path, 16 * SLOT, BLOCK, executor, RecordingMetrics(),
                                  scan_batch=4, scan_pause=gate, scrub_rate=1 << 30)
    try:
        await gate.reached.wait()
        # Not yet: it verifies every recovered block, and most are not indexed.
        assert store.scrub is None
        gate.released.set()
        await store.scanned()
        scrub = store.scrub
        assert scrub is not None and scrub.blocks == 9
        await store.idle()
        assert scrub.done and scrub.verified == 9 and scrub.dropped == 0
    finally:
        gate.released.set()
        await store.close()


def test_a_header_the_disk_fails_to_read_leaves_its_slot_out_and_the_scan_goes_on(
        tmp_path: Path) -> None:
    # A directory's descriptor: every pread fails in the kernel (EISDIR), as
    # every header of a device gone bad would (EIO).
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        found = scan_headers(fd, 5, 64 * 1024, 0, 5, bytes(16))
        assert found.unreadable == [0, 1, 2, 3, 4]
        assert len(found) == 0 and not found.corrupt and not found.empty
        # A run of them is a failing disk: the scan stops.
        with pytest.raises(OSError):
            scan_headers(fd, MAX_UNREADABLE_HEADERS, 64 * 1024, 0, MAX_UNREADABLE_HEADERS,
                         bytes(16))
    finally:
        os.close(fd)
