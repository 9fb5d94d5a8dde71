"""The slab file: round trips, chunked verification, the documented byte layout."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from sidecar.cache import slab as slab_module
from sidecar.cache.errors import ChecksumMismatch
from sidecar.cache.ident import BlockIdent
from sidecar.cache.slab import Slab

KIB = 1024
MIB = 1024 * KIB
BLOCK = 64 * KIB
IDENT = BlockIdent("bucket-1", "topic-x/0/00000000000000000042-seg.log", '"abc123"', 5)


def payload(size: int, seed: int = 1) -> bytes:
    return random.Random(seed).randbytes(size)


def slot_offset(slot: int, block_size: int) -> int:
    """Per the module docstring: file header, then (header page + data) per slot."""
    return 4096 + slot * (4096 + block_size)


def flip_byte(path: Path, offset: int) -> None:
    """Corrupt the file behind the slab's back, as a bad disk would."""
    with open(path, "r+b") as handle:
        handle.seek(offset)
        byte = handle.read(1)
        handle.seek(offset)
        handle.write(bytes([byte[0] ^ 0xFF]))


@pytest.fixture
def slab(tmp_path: Path) -> Iterator[Slab]:
    opened = Slab.open(tmp_path, slot_count=3, block_size=BLOCK)
    yield opened
    opened.close()


def test_round_trip(slab: Slab) -> None:
    data = payload(50_000)
    record = slab.write_block(1, IDENT, 7, data)
    assert (record.ident, record.slot, record.length, record.generation) == (IDENT, 1, 50_000, 7)
    assert slab.read_verified(1, 0, len(data), record) == data
    assert slab.read_verified(1, 1234, 40_000, record) == data[1234:40_000]
    assert slab.read_verified(1, 10, 10, record) == b""


def test_memoryview_input_and_empty_block(slab: Slab) -> None:
    data = payload(BLOCK)
    record = slab.write_block(0, IDENT, 1, memoryview(data))
    assert slab.read_verified(0, 0, BLOCK, record) == data
    empty = slab.write_block(2, IDENT, 2, b"")
    assert empty.checksums == () and slab.read_verified(2, 0, 0, empty) == b""


def test_ranges_outside_the_block_are_rejected(slab: Slab) -> None:
    record = slab.write_block(0, IDENT, 1, payload(100))
    with pytest.raises(ValueError):
        slab.read_verified(0, 0, 101, record)
    with pytest.raises(ValueError):
        slab.read_verified(1, 0, 10, record)
    with pytest.raises(ValueError):
        slab.write_block(0, IDENT, 2, payload(BLOCK + 1))
    with pytest.raises(IndexError):
        slab.write_block(3, IDENT, 2, b"x")


def test_corrupt_data_byte_raises(slab: Slab) -> None:
    data = payload(BLOCK)
    record = slab.write_block(2, IDENT, 1, data)
    flip_byte(slab.path, slot_offset(2, BLOCK) + 4096 + 777)
    with pytest.raises(ChecksumMismatch):
        slab.read_verified(2, 0, 10, record)


def test_verification_hashes_only_overlapping_chunks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    block = 4 * MIB  # four 1 MiB chunks
    slab = Slab.open(tmp_path, slot_count=1, block_size=block)
    try:
        assert slab.chunk_size == MIB
        data = payload(block)
        record = slab.write_block(0, IDENT, 1, data)
        assert len(record.checksums) == 4

        hashed: list[int] = []
        real = slab_module.chunk_checksum

        def counting(chunk: bytes | memoryview) -> int:
            hashed.append(len(chunk))
            return real(chunk)

        monkeypatch.setattr(slab_module, "chunk_checksum", counting)
        assert slab.read_verified(0, 100, 200, record) == data[100:200]
        assert hashed == [MIB]
        hashed.clear()
        assert slab.read_verified(0, MIB - 10, MIB + 10, record) == data[MIB - 10:MIB + 10]
        assert hashed == [MIB, MIB]

        # A bad byte in chunk 3 spoils chunk 3 only.
        flip_byte(slab.path, slot_offset(0, block) + 4096 + 3 * MIB + 5)
        assert slab.read_verified(0, 0, MIB, record) == data[:MIB]
        with pytest.raises(ChecksumMismatch) as failure:
            slab.read_verified(0, 3 * MIB, 3 * MIB + 1, record)
        assert failure.value.chunk == 3
    finally:
        slab.close()


def test_file_header_matches_the_documented_layout(slab: Slab) -> None:
    raw = slab.path.read_bytes()
    assert len(raw) == 4096 + 3 * (4096 + BLOCK)
    magic, version, reserved, slot_header_size, block_size, slot_count = struct.unpack_from(
        "<8sHHIQQ", raw, 0
    )
    assert (magic, version, reserved, slot_header_size) == (b"KCSLAB01", 2, 0, 4096)
    assert (block_size, slot_count) == (BLOCK, 3)
    epoch, checksum = struct.unpack_from("<QQ", raw, 32)
    assert epoch == 0 and checksum == xxhash.xxh64_intdigest(raw[:40])
    assert raw[48:4096] == bytes(4048)


def test_each_advance_of_the_epoch_is_in_the_file_header(tmp_path: Path) -> None:
    slab = Slab.open(tmp_path, 3, BLOCK)
    try:
        assert slab.epoch == 0
        assert (slab.advance_epoch(), slab.advance_epoch()) == (1, 2)
        slab.write_block(1, IDENT, slab_module.generation_of(2, 7), b"x")
    finally:
        slab.close()
    raw = (tmp_path / "slab.dat").read_bytes()
    assert struct.unpack_from("<Q", raw, 32)[0] == 2
    # Kept whole or resized, the slots keep their generations and the file its epoch.
    for slots in (3, 5):
        slab = Slab.open(tmp_path, slots, BLOCK)
        try:
            assert slab.epoch == 2 and slab.opening.state == ("reused" if slots == 3 else
                                                              "resized")
            record = slab.read_record(1)
            assert record is not None and record.generation == (2 << 40) + 7
        finally:
            slab.close()


def test_a_version_1_file_is_read_as_epoch_0_and_moved_on_to_version_2(
    tmp_path: Path
) -> None:
    slab = Slab.open(tmp_path, 3, BLOCK)
    slab.write_block(2, IDENT, 41, b"before the epoch")
    slab.close()
    # The version-1 header: no epoch, the checksum right after slot_count.
    fields = struct.pack("<8sHHIQQ", b"KCSLAB01", 1, 0, 4096, BLOCK, 3)
    with open(tmp_path / "slab.dat", "r+b") as handle:
        handle.write(fields + struct.pack("<Q", xxhash.xxh64_intdigest(fields)) + bytes(8))
    slab = Slab.open(tmp_path, 3, BLOCK)
    try:
        assert (slab.opening.state, slab.epoch) == ("reused", 0)
        record = slab.read_record(2)
        assert record is not None and record.generation == 41
        # Every generation of version 1 is below the first of epoch 1.
        assert slab.advance_epoch() == 1 and slab_module.generation_of(1, 1) > 41
    finally:
        slab.close()
    raw = (tmp_path / "slab.dat").read_bytes()
    assert struct.unpack_from("<HQ", raw, 8)[0] == 2
    assert struct.unpack_from("<Q", raw, 32)[0] == 1


def test_slot_header_matches_the_documented_layout(slab: Slab) -> None:
    data = payload(BLOCK - 4096 - 3)  # not a whole number of pages
    record = slab.write_block(1, IDENT, 0x0102030405, data)
    raw = slab.path.read_bytes()
    base = slot_offset(1, BLOCK)
    header = raw[base:base + 4096]
    assert raw[base + 4096:base + 4096 + len(data)] == data
    assert (base + 4096) % 4096 == 0

    fields = struct.unpack_from("<4sHHIQQIHHHH", header, 0)
    magic, version, flags, length, block, generation, chunk_size, chunk_count = fields[:8]
    bucket_len, key_len, etag_len = fields[8:]
    assert (magic, version, flags & 1) == (b"SLOT", 1, 1)
    assert (length, block, generation) == (len(data), 5, 0x0102030405)
    assert (chunk_size, chunk_count) == (BLOCK, 1)  # blocks under 1 MiB: one chunk
    offset = 40
    names = []
    for size in (bucket_len, key_len, etag_len):
        names.append(header[offset:offset + size].decode())
        offset += size
    assert names == [IDENT.bucket, IDENT.key, IDENT.etag]
    checksums = struct.unpack_from(f"<{chunk_count}Q", header, offset)
    assert checksums == record.checksums == (xxhash.xxh3_64_intdigest(data),)
    offset += 8 * chunk_count
    (header_checksum,) = struct.unpack_from("<Q", header, offset)
    assert header_checksum == xxhash.xxh3_64_intdigest(header[:offset])

    assert slab.read_record(1) == record


def test_invalidate_clears_the_valid_flag(slab: Slab) -> None:
    slab.write_block(0, IDENT, 1, b"hello")
    slab.invalidate(0)
    (flags,) = struct.unpack_from("<H", slab.path.read_bytes(), slot_offset(0, BLOCK) + 6)
    assert flags & 1 == 0
    assert slab.read_record(0) is None


def test_torn_header_is_not_a_record(slab: Slab) -> None:
    slab.write_block(0, IDENT, 1, b"hello")
    flip_byte(slab.path, slot_offset(0, BLOCK) + 45)  # inside the bucket name
    assert slab.read_record(0) is None
    assert slab.read_record(2) is None  # never written: all zeros


@pytest.mark.parametrize(
    "ident",
    [
        BlockIdent("b" * 64, "k", "e", 0),
        BlockIdent("b", "k" * 1025, "e", 0),
        BlockIdent("b", "k", "e" * 257, 0),
        BlockIdent("b", "k", "e", -1),
    ],
)
def test_oversized_names_are_rejected_before_touching_the_slot(
    slab: Slab, ident: BlockIdent
) -> None:
    record = slab.write_block(0, IDENT, 1, b"old block")
    with pytest.raises(ValueError):
        slab.write_block(0, ident, 2, b"new block")
    assert slab.read_record(0) == record
    assert slab.read_verified(0, 0, 9, record) == b"old block"


def test_largest_header_fits_its_page() -> None:
    block = 256 * MIB
    ident = BlockIdent("b" * 63, "k" * 1024, "e" * 256, 2**64 - 1)
    checksums = tuple(range(256))  # a full 256 MiB block of 1 MiB chunks
    header = slab_module.encode_slot_header(ident, 2**64 - 1, block, MIB, checksums)
    assert len(header) == 3439 <= 4096
    record = slab_module.decode_slot_header(header + bytes(4096 - len(header)), 7, block)
    assert record is not None
    assert (record.ident, record.slot, record.length, record.checksums) == (
        ident, 7, block, checksums
    )


@pytest.mark.parametrize("block_size", [0, 4095, 64 * KIB + 1, 512 * MIB])
def test_bad_block_size_is_rejected(tmp_path: Path, block_size: int) -> None:
    with pytest.raises(ValueError):
        Slab.open(tmp_path, slot_count=1, block_size=block_size)


def test_reopen_with_same_geometry_reuses_the_file(tmp_path: Path) -> None:
    first = Slab.open(tmp_path, slot_count=3, block_size=BLOCK)
    assert not first.reused
    data = payload(1000)
    record = first.write_block(2, IDENT, 1, data)
    inode = os.stat(first.path).st_ino
    first.close()

    second = Slab.open(tmp_path, slot_count=3, block_size=BLOCK)
    try:
        assert second.reused
        assert os.stat(second.path).st_ino == inode
        assert second.read_verified(2, 0, 1000, record) == data
        assert second.read_record(2) == record  # what a recovery would find
    finally:
        second.close()


def test_reopen_with_another_block_size_recreates_the_file(tmp_path: Path) -> None:
    first = Slab.open(tmp_path, slot_count=3, block_size=BLOCK)
    first.write_block(0, IDENT, 1, payload(1000))
    first.close()

    second = Slab.open(tmp_path, slot_count=3, block_size=2 * BLOCK)
    try:
        assert not second.reused and second.opening.state == "recreated"
        assert second.path.stat().st_size == 4096 + 3 * (4096 + 2 * BLOCK)
        assert second.read_record(0) is None  # the old slot headers are gone
    finally:
        second.close()


@pytest.mark.parametrize("slots", [2, 4])
def test_reopen_with_another_slot_count_keeps_the_common_slots(
    tmp_path: Path, slots: int
) -> None:
    # Slot offsets depend only on the block size: a resized cache keeps its blocks.
    first = Slab.open(tmp_path, slot_count=3, block_size=BLOCK)
    kept = first.write_block(1, IDENT, 1, payload(1000))
    first.write_block(2, IDENT, 2, payload(1000))
    first.close()

    second = Slab.open(tmp_path, slot_count=slots, block_size=BLOCK)
    try:
        assert second.reused and second.opening.state == "resized"
        assert second.opening.kept_slots == min(3, slots)
        assert second.path.stat().st_size == 4096 + slots * (4096 + BLOCK)
        assert second.read_record(1) == kept
        found = [second.read_record(slot) is not None for slot in range(slots)]
        assert found == [False, True, True, False][:slots]  # slot 3 is new: empty
    finally:
        second.close()


def test_file_with_a_damaged_header_is_recreated(tmp_path: Path) -> None:
    Slab.open(tmp_path, slot_count=1, block_size=BLOCK).close()
    flip_byte(tmp_path / "slab.dat", 20)  # block_size field; checksum no longer matches
    slab = Slab.open(tmp_path, slot_count=1, block_size=BLOCK)
    try:
        assert not slab.reused
    finally:
        slab.close()
