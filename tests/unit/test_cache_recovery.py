"""Warm restart: the store rebuilds its index from a real slab file in tmp_path.

Every test writes through the real slab, damages the file the way a crash or
a bad disk would, reopens, and checks that what comes back is either the exact
bytes or a miss, and that the report says what was dropped.
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import struct
import time
from array import array
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import xxhash

from sidecar.cache import BlockIdent, BlockStore, SlotRecord
from sidecar.cache import slab as slab_module
from sidecar.cache.index import IDENTITY_KEY_BYTES, SlotIndex, ident_hash
from sidecar.cache.recovery import ScanMerge
from sidecar.cache.scrub import SCRUB_BATCH_SLOTS
from sidecar.cache.slab import Slab
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.cache.slot_format import SlotScan, generation_of
from tests.support.cache_metrics import RecordingMetrics
from tests.support.waiting import eventually_async

# The identity key of every index here (sidecar.cache.index, "Identity hash").
KEY = bytes(range(16))

BLOCK = 64 * 1024
SLOT = BLOCK + 4096
SEED = 20261122


def slab_path(directory: Path) -> Path:
    return directory / "slab.dat"


def slot_offset(slot: int) -> int:
    return 4096 + slot * SLOT


def ident(n: int, key: str = "topic-abc/0/seg.log", etag: str = '"e1"') -> BlockIdent:
    return BlockIdent("tiered", key, etag, n)


async def open_store(
    directory: Path, executor: ThreadPoolExecutor, slots: int,
    metrics: RecordingMetrics | None = None, *, snapshot: bool = False,
) -> BlockStore:
    """The store reopened as after a kill -9 (no index snapshot: the slot headers
    are scanned), or with ``snapshot`` as after a clean stop."""
    if not snapshot:
        (directory / "index.snap").unlink(missing_ok=True)
    store = await BlockStore.open(directory, slots * SLOT, BLOCK, executor,
                                  metrics or RecordingMetrics())
    # These tests look at what the whole scan recovered (serving while it
    # runs: tests/unit/test_cache_scan.py), and write into the slots it
    # dropped, which are free only once their headers are erased.
    await store.scanned()
    await store.idle()
    return store


async def fill(store: BlockStore, rng: random.Random, count: int) -> dict[BlockIdent, bytes]:
    """`count` blocks of random sizes and names, written through the store."""
    blocks: dict[BlockIdent, bytes] = {}
    for n in range(count):
        block_ident = ident(n, key=f"topic-{rng.randrange(4)}/0/{n // 3:020d}.log",
                            etag=f'"{rng.randrange(2**32):08x}"')
        data = rng.randbytes(rng.choice([BLOCK, BLOCK, rng.randrange(1, BLOCK)]))
        assert (await store.write(block_ident, data)).record is not None
        blocks[block_ident] = data
    return blocks


def patch_file(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as handle:
        handle.seek(offset)
        handle.write(data)


def read_file(path: Path, offset: int, size: int) -> bytes:
    with open(path, "rb") as handle:
        handle.seek(offset)
        return handle.read(size)


async def test_reopen_recovers_every_block_byte_exact(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    rng = random.Random(SEED)
    store = await open_store(tmp_path, executor, slots=48)
    blocks = await fill(store, rng, 40)
    generations = [record.generation for i in blocks if (record := store.lookup(i)) is not None]
    assert len(generations) == 40
    await store.close()

    metrics = RecordingMetrics()
    store = await open_store(tmp_path, executor, slots=48, metrics=metrics)
    try:
        report = store.recovery
        assert report is not None
        assert (report.file, report.reason, report.recreated) == ("reused", None, False)
        assert (report.slots, report.slots_scanned) == (48, 48)
        assert report.blocks_recovered == 40 == store.block_count()
        assert report.bytes_recovered == sum(map(len, blocks.values())) == store.used_bytes()
        assert (report.corrupt_headers, report.duplicates, report.dropped) == (0, 0, 0)
        # The epoch (the slab's file header) moves on at each start that
        # scans: the first write of this one outranks every block on disk.
        assert report.epoch == 2
        assert report.next_generation == generation_of(2, 1) > generation_of(1, max(generations))
        assert report.as_dict()["blocks_recovered"] == 40
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident)
            assert record is not None
            assert await store.read(record, 0, len(data)) == data
            lo = rng.randrange(len(data))
            assert await store.read(record, lo, len(data)) == data[lo:]
        # The first write of the new epoch (its low 32 bits, as the index
        # keeps them).
        fresh = (await store.write(ident(999), b"new")).record
        assert fresh is not None and fresh.generation == generation_of(2, 1) & 0xFFFFFFFF
        assert metrics.evictions == {} and metrics.checksum_failures == 0
    finally:
        await store.close()


async def test_eviction_resumes_in_write_order(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    store = await open_store(tmp_path, executor, slots=8)
    for n in range(8):
        await store.write(ident(n), bytes([n]) * 100)
    await store.close()

    metrics = RecordingMetrics()
    store = await open_store(tmp_path, executor, slots=8, metrics=metrics)
    try:
        assert store.block_count() == 8
        written = await store.write(ident(100), b"x")
        assert written.record is not None  # full: the oldest goes
        assert metrics.evictions == {"capacity": 1}
        assert store.lookup(ident(0)) is None and store.lookup(ident(100)) is not None
    finally:
        await store.close()


async def test_small_objects_keep_their_protected_place_across_a_restart(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    manifest = ident(0, key="topic-abc/0/00000000000000000000-x.rsm-manifest")
    is_manifest = lambda block: block.key.endswith(".rsm-manifest")  # noqa: E731
    store = await BlockStore.open(tmp_path, 8 * SLOT, BLOCK, executor, RecordingMetrics(),
                                  admit_to_main=is_manifest)
    await store.write(manifest, b"m" * 100)
    for n in range(1, 4):
        await store.write(ident(n), bytes([n]) * 100)
    await store.close()

    store = await BlockStore.open(tmp_path, 8 * SLOT, BLOCK, executor, RecordingMetrics(),
                                  admit_to_main=is_manifest)
    try:
        # A scan of one-hit blocks, many times the cache: only probation turns over.
        for n in range(100, 140):
            await store.write(ident(n), b"s" * 100)
        assert store.lookup(manifest) is not None
        assert store.lookup(ident(1)) is None  # recovered, unprotected: gone with the scan
    finally:
        await store.close()


@pytest.mark.parametrize("newer_slot", [0, 1])
async def test_duplicates_keep_the_higher_generation(
    tmp_path: Path, executor: ThreadPoolExecutor, newer_slot: int
) -> None:
    # A replacement written to a new slot while the old slot's invalidation never
    # reached the disk: two valid headers name the same block.
    slab = Slab.open(tmp_path, slot_count=4, block_size=BLOCK)
    old, new = b"old" * 1000, b"new" * 1000
    slab.write_block(1 - newer_slot, ident(7), 5, old)
    slab.write_block(newer_slot, ident(7), 9, new)
    slab.write_block(2, ident(8), 6, b"other")
    slab.close()

    metrics = RecordingMetrics()
    store = await open_store(tmp_path, executor, slots=4, metrics=metrics)
    try:
        assert store.recovery is not None
        assert (store.recovery.blocks_recovered, store.recovery.duplicates) == (2, 1)
        assert metrics.evictions == {"recovery": 1}
        record = store.lookup(ident(7))
        assert record is not None and (record.slot, record.generation) == (newer_slot, 9)
        assert await store.read(record, 0, len(new)) == new
        # A new epoch: above the 9 on disk.
        assert store.recovery.next_generation == generation_of(1, 1) > 9
    finally:
        await store.close()
    # The loser was erased: the next start neither recovers nor counts it.
    store = await open_store(tmp_path, executor, slots=4)
    try:
        assert store.recovery is not None
        assert (store.recovery.blocks_recovered, store.recovery.duplicates) == (2, 0)
    finally:
        await store.close()


def rebuilt_header(record: SlotRecord, **fields: Any) -> bytes:
    """A header with some fixed fields changed and a checksum that matches again."""
    values = {"length": record.length, "chunk_size": min(BLOCK, 1 << 20)}
    values.update(fields)
    header = bytearray(slab_module.encode_slot_header(
        record.ident, record.generation, record.length, values["chunk_size"], record.checksums
    ))
    header[8:12] = int(values["length"]).to_bytes(4, "little")
    body = bytes(header[:-8])
    header[-8:] = slab_module.chunk_checksum(body).to_bytes(8, "little")
    return bytes(header)


async def test_corrupt_and_torn_headers_are_dropped_and_counted(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(SEED)
    store = await open_store(tmp_path, executor, slots=12)
    blocks = await fill(store, rng, 10)
    records = {i: store.lookup(i, touch=False) for i in blocks}
    await store.close()
    by_slot = {r.slot: r for r in records.values() if r is not None}
    path = slab_path(tmp_path)

    # slot 0: a flipped bit in the key (the header checksum no longer matches)
    patch_file(path, slot_offset(0) + 45, bytes([read_file(path, slot_offset(0) + 45, 1)[0] ^ 1]))
    # slot 1: garbage where the magic was
    patch_file(path, slot_offset(1), b"\x13\x37garbage")
    # slot 2: a length larger than a block, under a checksum that matches
    patch_file(path, slot_offset(2), rebuilt_header(by_slot[2], length=BLOCK + 1))
    # slot 3: torn: the first half of another block's header over the old one
    other = slab_module.encode_slot_header(
        ident(500, key="k" * 900), 77, 10, BLOCK, (1,)
    )
    patch_file(path, slot_offset(3), other[:512])
    # slot 4: a write that stopped after clearing the flag (step 1): empty, not damage
    patch_file(path, slot_offset(4) + 6, b"\x00\x00")
    # slot 5: another version of the format
    patch_file(path, slot_offset(5) + 4, b"\x02\x00")

    metrics = RecordingMetrics()
    with caplog.at_level(logging.INFO, logger="sidecar.cache.store"):
        store = await open_store(tmp_path, executor, slots=12, metrics=metrics)
    try:
        report = store.recovery
        assert report is not None
        assert (report.corrupt_headers, report.duplicates, report.blocks_recovered) == (5, 0, 4)
        assert metrics.evictions == {"recovery": 5}
        assert "5 corrupt" in caplog.text and "cache recovery:" in caplog.text
        for slot in range(10):
            found = store.lookup(by_slot[slot].ident)
            if slot < 6:
                assert found is None
            else:
                assert found is not None
                data = blocks[found.ident]
                assert await store.read(found, 0, len(data)) == data
        # The dropped slots are free again: all 8 of them can be written.
        for n in range(8):
            assert (await store.write(ident(1000 + n), b"y" * 10)).record is not None
        assert metrics.evictions == {"recovery": 5}
    finally:
        await store.close()
    store = await open_store(tmp_path, executor, slots=12)
    try:
        assert store.recovery is not None and store.recovery.corrupt_headers == 0
        assert store.recovery.blocks_recovered == 12
    finally:
        await store.close()


async def test_flipped_data_is_a_miss_never_wrong_bytes(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    rng = random.Random(SEED)
    store = await open_store(tmp_path, executor, slots=40)
    blocks = await fill(store, rng, 30)
    records = {i: store.lookup(i, touch=False) for i in blocks}
    await store.close()
    path = slab_path(tmp_path)
    damaged: set[BlockIdent] = set()
    for block_ident in rng.sample(sorted(blocks), 12):
        record = records[block_ident]
        assert record is not None
        for _ in range(rng.randrange(1, 4)):
            offset = slot_offset(record.slot) + 4096 + rng.randrange(record.length)
            old = read_file(path, offset, 1)[0]
            patch_file(path, offset, bytes([old ^ rng.randrange(1, 256)]))
        damaged.add(block_ident)

    metrics = RecordingMetrics()
    store = await open_store(tmp_path, executor, slots=40, metrics=metrics)
    try:
        # Headers are intact: everything is recovered, the data is checked on read.
        assert store.recovery is not None and store.recovery.blocks_recovered == 30
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident)
            assert record is not None
            got = await store.read(record, 0, len(data))
            if block_ident in damaged:
                assert got is None
                assert store.lookup(block_ident) is None  # dropped: the next read refetches
            else:
                assert got == data
        assert metrics.checksum_failures == len(damaged) == 12
        assert metrics.evictions == {"checksum": 12}
    finally:
        await store.close()


@pytest.mark.parametrize(("stop_after", "left"), [
    (0, "old"), (1, "empty"), (2, "empty"), (2.5, "torn"), (3, "new"),
])
async def test_a_crash_at_each_step_of_a_write(
    tmp_path: Path, executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch,
    stop_after: float, left: str,
) -> None:
    """The table in slab.py: what a crash after each of write_block's three pwrites
    (clear flag, data, header) leaves; 2.5 is the header write torn in half."""
    old, new = b"o" * 5000, b"n" * 7000
    slab = Slab.open(tmp_path, slot_count=2, block_size=BLOCK)
    slab.write_block(0, ident(1), 1, old)

    class Crash(Exception):
        pass

    real = slab_module._pwrite_all
    calls = 0

    def crashing(fd: int, data: bytes | memoryview, offset: int) -> None:
        nonlocal calls
        if calls >= stop_after:
            raise Crash
        calls += 1
        if calls > stop_after:  # the torn header: only its first half lands
            real(fd, bytes(data)[:len(data) // 2], offset)
            raise Crash
        real(fd, data, offset)

    monkeypatch.setattr(slab_module, "_pwrite_all", crashing)
    with pytest.raises(Crash):
        slab.write_block(0, ident(2), 2, new)
        raise Crash  # all three steps done: the crash comes right after
    monkeypatch.setattr(slab_module, "_pwrite_all", real)
    slab.close()

    store = await open_store(tmp_path, executor, slots=2)
    try:
        report = store.recovery
        assert report is not None
        assert report.corrupt_headers == (1 if left == "torn" else 0)
        if left in ("empty", "torn"):
            assert report.blocks_recovered == 0
            assert store.lookup(ident(1)) is None and store.lookup(ident(2)) is None
        else:
            block_ident, data = (ident(1), old) if left == "old" else (ident(2), new)
            record = store.lookup(block_ident)
            assert record is not None and report.blocks_recovered == 1
            assert await store.read(record, 0, len(data)) == data
    finally:
        await store.close()


async def test_truncated_slab_keeps_the_slots_wholly_present(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store(tmp_path, executor, slots=8)
    blocks = {ident(n): bytes([n + 1]) * BLOCK for n in range(8)}
    for block_ident, data in blocks.items():
        await store.write(block_ident, data)
    slots = {i: record.slot for i in blocks if (record := store.lookup(i)) is not None}
    assert len(slots) == 8
    await store.close()
    path = slab_path(tmp_path)
    os.truncate(path, slot_offset(5) + 4096 + BLOCK // 2)  # slot 5 loses half its data

    metrics = RecordingMetrics()
    with caplog.at_level(logging.WARNING, logger="sidecar.cache.store"):
        store = await open_store(tmp_path, executor, slots=8, metrics=metrics)
    try:
        report = store.recovery
        assert report is not None
        assert report.file == "truncated" and not report.recreated
        assert report.reason is not None and "kept the 5 slots" in report.reason
        assert "kept the 5 slots" in caplog.text
        assert (report.slots_scanned, report.blocks_recovered) == (5, 5)
        assert path.stat().st_size == 4096 + 8 * SLOT
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident)
            if slots[block_ident] < 5:
                assert record is not None and await store.read(record, 0, BLOCK) == data
            else:
                assert record is None
        for n in range(3):  # the lost slots are free
            assert (await store.write(ident(100 + n), b"z")).record is not None
        assert metrics.evictions == {} and metrics.checksum_failures == 0
    finally:
        await store.close()


@pytest.mark.parametrize("damage", ["garbage", "short", "empty"])
async def test_a_damaged_file_header_starts_empty_and_says_so(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    store = await open_store(tmp_path, executor, slots=4)
    await store.write(ident(1), b"a" * 100)
    await store.close()
    path = slab_path(tmp_path)
    if damage == "garbage":
        patch_file(path, 0, random.Random(SEED).randbytes(4096))
    else:
        os.truncate(path, 20 if damage == "short" else 0)  # shorter than its header

    with caplog.at_level(logging.WARNING, logger="sidecar.cache.store"):
        store = await open_store(tmp_path, executor, slots=4)
    try:
        report = store.recovery
        assert report is not None and report.recreated and report.file == "recreated"
        assert report.reason is not None and "file header" in report.reason
        assert report.reason in caplog.text
        assert (report.blocks_recovered, report.slots_scanned) == (0, 0)
        assert store.lookup(ident(1)) is None
        assert path.stat().st_size == 4096 + 4 * SLOT
        record = (await store.write(ident(2), b"b" * 100)).record
        assert record is not None and await store.read(record, 0, 100) == b"b" * 100
    finally:
        await store.close()


async def test_a_resized_cache_keeps_the_common_slots(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    store = await open_store(tmp_path, executor, slots=8)
    for n in range(8):
        await store.write(ident(n), bytes([n]) * 1000)
    await store.close()

    store = await open_store(tmp_path, executor, slots=4)
    try:
        report = store.recovery
        assert report is not None and report.file == "resized"
        assert (report.blocks_recovered, report.slots) == (4, 4)
        assert {store.lookup(ident(n)) is not None for n in range(4)} == {True}
        assert store.capacity_bytes() == 4 * BLOCK
    finally:
        await store.close()
    store = await open_store(tmp_path, executor, slots=6)
    try:
        assert store.recovery is not None and store.recovery.blocks_recovered == 4
        assert (await store.write(ident(50), b"q")).record is not None
        assert (await store.write(ident(51), b"q")).record is not None
        assert store.block_count() == 6
    finally:
        await store.close()


def test_the_scan_merge_is_deterministic_on_equal_generations() -> None:
    # Not something one slab's counter makes; a disk inventing it must not make
    # the choice depend on scan order.
    a = SlotRecord(ident(1), 3, 10, 4, (1,))
    b = SlotRecord(ident(1), 7, 10, 4, (2,))
    for records in ([a, b], [b, a]):
        found = SlotScan(array("I"), array("Q"), array("I"), bytearray(), array("Q"),
                         bytearray(), [5])
        for record in records:
            found.slots.append(record.slot)
            found.generations.append(record.generation)
            found.lengths.append(record.length)
            found.hashes.extend(ident_hash(record.ident, KEY))
            found.checksums.extend(array("Q", record.checksums))
            found.main.append(0)
        found.empty.extend([0, 1, 2, 4, 6])
        index = SlotIndex(8, 4096, 4096, KEY)
        policy = SlotFifo(8, index.fingerprint_of)
        merge = ScanMerge(index, policy, first_generation=1 << 40)
        dropped: list[int] = []

        def drop(slot: int, index: SlotIndex = index, policy: SlotFifo = policy,
                 dropped: list[int] = dropped) -> None:
            index.remove(slot)
            policy.remove(slot)
            dropped.append(slot)

        merged = merge.merge(found, 8, drop)
        assert index.find(ident_hash(ident(1), KEY)) == 7 and len(index) == 1
        assert index.checksums_of(7) == (2,) and policy.queue("small") == [7]
        assert merge.corrupt_headers == 1 and merge.duplicates == 1
        assert merge.blocks_recovered == 1 and merge.bytes_recovered == 10
        assert merged.free == [0, 1, 2, 4, 6]
        # In one batch the loser was never visible (the merge does not yield):
        # it is erased either way, never dropped as a live block.
        assert merged.erase == [5, 3] and dropped == [] and merge.slots_scanned == 8
        assert index.used_bytes == 10


async def test_the_scrub_drops_damaged_blocks_before_anyone_reads_them(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    rng = random.Random(SEED)
    store = await open_store(tmp_path, executor, slots=24)
    blocks = await fill(store, rng, 20)
    records = {i: r for i in blocks if (r := store.lookup(i)) is not None}
    await store.close()
    damaged = rng.sample(sorted(blocks), 3)
    for block_ident in damaged:
        record = records[block_ident]
        offset = slot_offset(record.slot) + 4096 + rng.randrange(record.length)
        patch_file(slab_path(tmp_path), offset,
                   bytes([read_file(slab_path(tmp_path), offset, 1)[0] ^ 0x55]))

    metrics = RecordingMetrics()
    store = await BlockStore.open(tmp_path, 24 * SLOT, BLOCK, executor, metrics,
                                  scrub_rate=1 << 30)
    try:
        # The damage changed the slab after the snapshot: the headers are
        # scanned, and the scrub starts once every block is indexed.
        await store.scanned()
        scrub = store.scrub
        assert scrub is not None
        await eventually_async(lambda: scrub.done, "the scrub to finish", timeout=20.0)
        assert (scrub.blocks, scrub.verified, scrub.dropped, scrub.skipped) == (20, 17, 3, 0)
        assert scrub.verified_bytes == sum(len(blocks[i]) for i in blocks if i not in damaged)
        assert metrics.checksum_failures == 3 and metrics.evictions == {"checksum": 3}
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident)
            if block_ident in damaged:
                assert record is None  # never served: the next read refetches
            else:
                assert record is not None and await store.read(record, 0, len(data)) == data
        stats = store.recovery_stats()
        assert stats is not None and stats["scrub"]["dropped"] == 3
        assert stats["blocks_recovered"] == 20
    finally:
        await store.close()


async def test_the_scrub_keeps_to_its_rate_and_stops_on_close(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    store = await open_store(tmp_path, executor, slots=8)
    for n in range(8):
        await store.write(ident(n), bytes([n]) * BLOCK)
    await store.close()

    # 4 blocks a second: the first block at once, then one every 0.25 s.
    store = await BlockStore.open(tmp_path, 8 * SLOT, BLOCK, executor, RecordingMetrics(),
                                  scrub_rate=4 * BLOCK)
    started = time.monotonic()
    scrub = store.scrub
    assert scrub is not None
    await eventually_async(lambda: scrub.verified >= 3, "the scrub to verify three blocks",
                           timeout=20.0)
    assert time.monotonic() - started >= 0.45  # three blocks: at least two gaps
    await store.close()
    assert time.monotonic() - started < 10  # close did not wait for the other blocks
    verified = scrub.verified
    assert not scrub.done and verified < 8
    await asyncio.sleep(0.6)
    assert scrub.verified == verified  # stopped, not merely detached


async def test_without_a_scrub_rate_nothing_reads_the_data_at_start(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    store = await open_store(tmp_path, executor, slots=4)
    await store.write(ident(1), b"d" * 100)
    await store.close()
    store = await open_store(tmp_path, executor, slots=4)
    try:
        stats = store.recovery_stats()
        assert store.scrub is None and stats is not None and stats["scrub"] is None
        assert stats["blocks_recovered"] == 1
    finally:
        await store.close()


async def test_a_clean_stop_leaves_an_index_the_next_start_takes_over(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    rng = random.Random(SEED)
    store = await open_store(tmp_path, executor, slots=24)
    blocks = await fill(store, rng, 20)
    for block_ident in list(blocks)[:5]:  # proven reuse: these go to main
        store.lookup(block_ident)
    store.lookup(next(iter(blocks)))  # a second hit
    before = {b: store.lookup(b, touch=False) for b in blocks}
    await store.close()
    assert (tmp_path / "index.snap").exists()

    store = await open_store(tmp_path, executor, slots=24, snapshot=True)
    try:
        report = store.recovery
        assert report is not None and report.index == "snapshot"
        assert (report.blocks_recovered, report.bytes_recovered) == (
            20, sum(len(data) for data in blocks.values()))
        # Taken, and gone from the disk before the first write: a crash from
        # here on leaves no snapshot to mislead the next start.
        assert not (tmp_path / "index.snap").exists()
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident, touch=False)
            assert record == before[block_ident]
            assert record is not None and await store.read(record, 0, len(data)) == data
        # The queues came back as they were: a scan-era block goes first, the
        # five hit ones stay (second chances), the write counter resumes.
        for n in range(4 + 5):
            written = await store.write(ident(900 + n), b"x")
            assert written.record is not None
            assert written.record.generation == (report.next_generation + n) & 0xFFFFFFFF
        assert all(store.lookup(b, touch=False) is not None for b in list(blocks)[:5])
        assert sum(store.lookup(b, touch=False) is None for b in list(blocks)[5:]) == 5
    finally:
        await store.close()


async def test_the_snapshot_and_a_scan_give_the_same_index(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    store = await open_store(tmp_path, executor, slots=24)
    blocks = await fill(store, random.Random(SEED), 20)
    await store.close()
    snap = (tmp_path / "index.snap").read_bytes()
    found = {}
    for use in (True, False):
        (tmp_path / "index.snap").write_bytes(snap)
        store = await open_store(tmp_path, executor, slots=24, snapshot=use)
        assert store.recovery is not None
        assert store.recovery.index == ("snapshot" if use else "scan")
        found[use] = ({b: store.lookup(b, touch=False) for b in blocks}, store.used_bytes())
        # The snapshot resumes the counter of the epoch it was saved in; a
        # scan starts the next epoch, above it.
        assert store.recovery.next_generation >= generation_of(1, 21)
        await store.close()
    assert found[True] == found[False]


@pytest.mark.parametrize("damage", ["body", "header", "cut", "slab-written", "resized"])
async def test_a_snapshot_that_does_not_fit_the_slab_is_not_used(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture,
    damage: str,
) -> None:
    store = await open_store(tmp_path, executor, slots=24)
    blocks = await fill(store, random.Random(SEED), 12)
    await store.close()
    snap = tmp_path / "index.snap"
    slots = 24
    if damage in ("body", "header"):
        at = snap.stat().st_size - 100 if damage == "body" else 20
        patch_file(snap, at, bytes([read_file(snap, at, 1)[0] ^ 0x10]))
    elif damage == "cut":
        os.truncate(snap, snap.stat().st_size - 1)
    elif damage == "slab-written":  # by something else after the clean stop
        stat = slab_path(tmp_path).stat()
        os.utime(slab_path(tmp_path), ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    else:
        slots = 30
    caplog.set_level(logging.INFO, logger="sidecar.cache")
    store = await open_store(tmp_path, executor, slots=slots, snapshot=True)
    try:
        assert store.recovery is not None and store.recovery.index == "scan"
        assert store.recovery.blocks_recovered == 12 and not snap.exists()
        assert "snapshot not used" in caplog.text or "scanning the slots" in caplog.text
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident)
            assert record is not None and await store.read(record, 0, len(data)) == data
    finally:
        await store.close()


async def test_a_snapshot_that_cannot_be_saved_costs_a_scan_not_the_stop(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture
) -> None:
    store = await open_store(tmp_path, executor, slots=8)
    blocks = await fill(store, random.Random(SEED), 5)
    (tmp_path / "index.snap.tmp").mkdir()  # where the snapshot is written first
    caplog.set_level(logging.INFO, logger="sidecar.cache")
    await store.close()
    assert "could not save the cache index snapshot" in caplog.text
    assert not (tmp_path / "index.snap").exists()
    (tmp_path / "index.snap.tmp").rmdir()
    store = await open_store(tmp_path, executor, slots=8, snapshot=True)
    try:
        assert store.recovery is not None and store.recovery.index == "scan"
        assert all(store.lookup(b, touch=False) is not None for b in blocks)
    finally:
        await store.close()


async def test_a_snapshot_of_unkeyed_identities_is_not_used_and_the_scan_keys_anew(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    # Version 1 of the snapshot held unkeyed identity hashes: taking it over
    # would keep them (and their collisions). It is of another format: the
    # slot headers are scanned, every block comes back under a new key.
    store = await open_store(tmp_path, executor, slots=24)
    blocks = await fill(store, random.Random(SEED), 12)
    await store.close()
    snap = bytearray((tmp_path / "index.snap").read_bytes())
    struct.pack_into("<H", snap, 8, 1)  # the version field of a version-1 snapshot
    (tmp_path / "index.snap").write_bytes(snap)
    store = await open_store(tmp_path, executor, slots=24, snapshot=True)
    try:
        assert store.recovery is not None and store.recovery.index == "scan"
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident, touch=False)
            assert record is not None and await store.read(record, 0, len(data)) == data
    finally:
        await store.close()


def reseal_snapshot(path: Path, change: Callable[[int, int, int, bytearray, list[int]], None]
                    ) -> None:
    """Let `change(slots, chunks, free_count, body, head_fields)` edit a snapshot's
    body and header fields, then write it back with both checksums right again:
    a file only its range checks can refuse."""
    raw = path.read_bytes()
    head_struct = struct.Struct(f"<8sHHIQQQQQQQQQQqqqqqq{IDENTITY_KEY_BYTES}sQ")
    fields = list(head_struct.unpack_from(raw))
    body = bytearray(raw[head_struct.size + 8:])
    chunks, slots, free_count = fields[3], fields[4], fields[13]
    change(slots, chunks, free_count, body, fields)
    fields[-1] = xxhash.xxh3_64_intdigest(bytes(body))
    head = head_struct.pack(*fields)
    path.write_bytes(head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head)) + bytes(body))


def body_offsets(slots: int, chunks: int) -> dict[str, int]:
    """Where each array of the snapshot body starts (sidecar.cache.snapshot's layout)."""
    table = slots + slots // 4 + 1
    offsets, at = {}, 0
    for name, size in (("tags", 4 * slots), ("hashes", 8 * slots), ("lengths", 4 * slots),
                       ("generations", 4 * slots), ("checksums", 8 * chunks * slots),
                       ("table", 4 * table), ("prev", 4 * slots), ("next", 4 * slots),
                       ("states", slots), ("free", 0)):
        offsets[name] = at
        at += size
    return offsets


@pytest.mark.parametrize("where", ["table", "prev", "next", "free", "negative-free",
                                   "states", "queue", "count", "length"])
async def test_a_snapshot_with_a_slot_number_outside_the_slab_falls_back_to_the_scan(
    tmp_path: Path, executor: ThreadPoolExecutor, caplog: pytest.LogCaptureFixture, where: str,
) -> None:
    store = await open_store(tmp_path, executor, slots=24)
    blocks = await fill(store, random.Random(SEED), 12)
    await store.close()

    def damage(slots: int, chunks: int, free_count: int, body: bytearray,
               fields: list[int]) -> None:
        at = body_offsets(slots, chunks)
        assert free_count > 0 and table_has_a_slot(body, at["table"], slots)
        if where in ("table", "prev", "next", "free", "negative-free"):
            offset = at[where if where != "negative-free" else "free"]
            if where == "table":  # the first entry that names a slot
                offset += 4 * next(i for i in range(slots + slots // 4 + 1)
                                   if struct.unpack_from("<i", body, offset + 4 * i)[0] >= 0)
            value = -7 if where == "negative-free" else slots + 5
            struct.pack_into("<i", body, offset, value)
        elif where == "states":
            body[at["states"]] = 0x0C  # both queues at once
        elif where == "length":  # a held block longer than a slot
            held = next(slot for slot in range(slots)
                        if struct.unpack_from("<I", body, at["lengths"] + 4 * slot)[0]
                        != 0xFFFFFFFF)
            struct.pack_into("<I", body, at["lengths"] + 4 * held, BLOCK + 1)
        elif where == "queue":
            fields[15] = slots + 1  # the small queue's head
        else:
            fields[11] = slots + 1  # more blocks than slots

    reseal_snapshot(tmp_path / "index.snap", damage)
    caplog.set_level(logging.INFO, logger="sidecar.cache")
    store = await open_store(tmp_path, executor, slots=24, snapshot=True)
    try:
        assert store.recovery is not None and store.recovery.index == "scan"
        assert "out of range): scanning the slots" in caplog.text
        assert store.recovery.blocks_recovered == 12
        for block_ident, data in blocks.items():
            record = store.lookup(block_ident)
            assert record is not None and await store.read(record, 0, len(data)) == data
    finally:
        await store.close()


def table_has_a_slot(body: bytearray, offset: int, slots: int) -> bool:
    return any(struct.unpack_from("<i", body, offset + 4 * i)[0] >= 0
               for i in range(slots + slots // 4 + 1))


async def test_a_resealed_but_unchanged_snapshot_is_still_taken_over(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    """The resealing above is faithful: without a change the snapshot is used."""
    store = await open_store(tmp_path, executor, slots=24)
    await fill(store, random.Random(SEED), 12)
    await store.close()
    reseal_snapshot(tmp_path / "index.snap", lambda *args: None)
    store = await open_store(tmp_path, executor, slots=24, snapshot=True)
    try:
        assert store.recovery is not None and store.recovery.index == "snapshot"
    finally:
        await store.close()


@pytest.mark.parametrize("left_out", ["invalidated", "shrunk"])
async def test_slots_neither_free_nor_live_at_a_clean_stop_are_usable_after_it(
    tmp_path: Path, executor: ThreadPoolExecutor, left_out: str
) -> None:
    # A block dropped right before the stop is still having its valid flag
    # cleared when the store closes, and a slot given back to the disk is out
    # of the free stack: neither goes back to it once the store is closed.
    # The next start must still have every slot, as a scan would give it.
    store = await open_store(tmp_path, executor, slots=8)
    for n in range(4):
        assert (await store.write(ident(n, key=f"topic-abc/0/{n:020d}.log"), b"d" * 100)
                ).record is not None
    if left_out == "invalidated":
        assert store.invalidate_object("tiered", "topic-abc/0/00000000000000000000.log"
                                       ).blocks == 1
        kept = 3
    else:
        assert store.shrink(2 * SLOT).released_bytes == 2 * SLOT
        kept = 4
    await store.close()

    store = await open_store(tmp_path, executor, slots=8, snapshot=True)
    try:
        assert store.recovery is not None and store.recovery.index == "snapshot"
        assert store.block_count() == kept
        fresh = [ident(n, key="topic-new/0/seg.log") for n in range(8 - kept)]
        for block_ident in fresh:
            assert (await store.write(block_ident, b"n" * 100)).record is not None
        # Every slot holds a block, none of the old ones was evicted for them.
        assert store.block_count() == 8
        assert all(store.lookup(b, touch=False) is not None for b in fresh)
    finally:
        await store.close()


async def test_blocks_gone_before_their_turn_are_counted_as_such(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    store = await open_store(tmp_path, executor, slots=8)
    for n in range(8):
        await store.write(ident(0, key=f"topic-abc/0/{n:020d}.log"), bytes([n]) * BLOCK)
    await store.close()

    # 8 blocks a second: the last slots' turn comes long after they are dropped.
    store = await BlockStore.open(tmp_path, 8 * SLOT, BLOCK, executor, RecordingMetrics(),
                                  scrub_rate=8 * BLOCK)
    try:
        scrub = store.scrub
        assert scrub is not None
        await eventually_async(lambda: scrub.blocks == 8, "the scrub to mark its blocks")
        for n in (5, 7):  # invalidated, as a DELETE of the object does
            assert store.invalidate_object("tiered", f"topic-abc/0/{n:020d}.log").blocks == 1
        await eventually_async(lambda: scrub.done, "the scrub to finish", timeout=20.0)
        # Every block it set out to verify is accounted for, once.
        assert (scrub.verified, scrub.dropped, scrub.skipped) == (6, 0, 2)
        stats = store.recovery_stats()
        assert stats is not None and stats["scrub"]["skipped"] == 2
    finally:
        await store.close()


async def test_the_scrub_gives_the_loop_back_while_it_passes_over_the_slots(
    tmp_path: Path, executor: ThreadPoolExecutor
) -> None:
    # Blocks in the first and the last of three batches of slots, none between.
    slots = 2 * SCRUB_BATCH_SLOTS + 1
    store = await BlockStore.open(tmp_path, slots * SLOT, BLOCK, executor, RecordingMetrics(),
                                  preallocate=False)
    await store.write(ident(0), b"a" * 100)  # slot 0
    assert store.shrink((slots - 2) * SLOT).released_bytes == (slots - 2) * SLOT
    await store.write(ident(1), b"b" * 100)  # the last slot, the only one free
    await store.close()

    store = await BlockStore.open(tmp_path, slots * SLOT, BLOCK, executor, RecordingMetrics(),
                                  preallocate=False, scrub_rate=1 << 30)
    try:
        scrub = store.scrub
        assert scrub is not None
        seen: set[tuple[int, int]] = set()

        async def other_work() -> None:  # what the loop runs between the scrub's steps
            while not scrub.done:
                seen.add((scrub.blocks, scrub.verified))
                await asyncio.sleep(0)

        await asyncio.wait_for(other_work(), timeout=20)
        assert (scrub.blocks, scrub.verified, scrub.dropped) == (2, 2, 0)
        # The loop ran between marking the first block and the last one, not
        # only once the whole pass over the slots was over.
        assert (1, 0) in seen
    finally:
        await store.close()
