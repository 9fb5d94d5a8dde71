"""Fuzzing what the cache reads back from its disk: slot headers
(sidecar.cache.slot_format) and the index snapshot (sidecar.cache.snapshot).

No input crashes them: a header is a block or a HeaderState, a snapshot is
taken over or refused with a reason. None gets past them wrongly: a changed
header never names another block than was written, and a snapshot taken over
holds only slot numbers inside the slab, so using it never raises.
"""

from __future__ import annotations

import struct
import tempfile
from array import array
from collections.abc import Callable
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.cache import BlockIdent, SlotRecord
from sidecar.cache.index import IDENTITY_KEY_BYTES, SlotIndex, ident_hash
from sidecar.cache.slot_fifo import SlotFifo
from sidecar.cache.slot_format import (
    HeaderState,
    chunk_size_for,
    encode_slot_header,
    inspect_slot_header,
)
from sidecar.cache.snapshot import SNAPSHOT_FILE_NAME, save, take
from tests.support.fuzz_corpus import binary_seeds

BLOCK = 64 * 1024
HEADER = 4096
SEEDS = binary_seeds("slot_header")


def inspect(header: bytes) -> SlotRecord | HeaderState:
    result = inspect_slot_header(header, 5, BLOCK)
    assert isinstance(result, SlotRecord | HeaderState)
    if isinstance(result, SlotRecord):
        assert 0 <= result.length <= BLOCK and result.slot == 5
    return result


@pytest.mark.parametrize("header", SEEDS, ids=[str(i) for i in range(len(SEEDS))])
def test_slot_header_corpus(header: bytes) -> None:
    inspect(header)


def flips(seeds: list[bytes]) -> st.SearchStrategy[tuple[bytes, bytes]]:
    """(a seed, the seed with a few bytes changed)."""
    def change(seed: bytes, edits: list[tuple[int, int]]) -> tuple[bytes, bytes]:
        changed = bytearray(seed)
        for at, value in edits:
            if changed:
                changed[at % len(changed)] ^= value or 1
        return seed, bytes(changed)
    return st.builds(change, st.sampled_from(seeds),
                     st.lists(st.tuples(st.integers(0, HEADER), st.integers(0, 255)),
                              min_size=1, max_size=4))


@given(flips(SEEDS))
def test_a_changed_header_never_names_another_block(pair: tuple[bytes, bytes]) -> None:
    seed, changed = pair
    before, after = inspect(seed), inspect(changed)
    if isinstance(after, SlotRecord):
        # Only bytes past the checksum (padding) may change without it noticing.
        assert after == before


@given(st.binary(max_size=HEADER))
def test_any_bytes_are_a_block_or_not_one(header: bytes) -> None:
    inspect(header)


@given(st.text(max_size=40), st.text(max_size=300), st.text(max_size=40),
       st.integers(0, 2**64 - 1), st.integers(0, BLOCK))
def test_what_is_encoded_decodes_to_itself(bucket: str, key: str, etag: str, block: int,
                                           length: int) -> None:
    ident = BlockIdent(bucket, key, etag, block)
    chunks = tuple(range(-(-length // chunk_size_for(BLOCK))))
    try:
        header = encode_slot_header(ident, 9, length, chunk_size_for(BLOCK), chunks)
    except ValueError:
        return  # a name over its limit: refused when written, as documented
    assert inspect(header + bytes(HEADER - len(header))) == SlotRecord(ident, 5, length, 9,
                                                                        chunks)


# --- the index snapshot ------------------------------------------------------------

SLOTS = 16
_HEAD = struct.Struct(f"<8sHHIQQQQQQQQQQqqqqqq{IDENTITY_KEY_BYTES}sQ")


def snapshot_of_a_small_index(directory: Path) -> tuple[Path, bytes]:
    """A slab stand-in and the snapshot of an index with a few blocks in it."""
    slab = directory / "slab.dat"
    slab.write_bytes(b"slab")
    chunk = chunk_size_for(BLOCK)
    index = SlotIndex(SLOTS, BLOCK, chunk)
    policy = SlotFifo(SLOTS, index.fingerprint_of)
    for slot in range(6):
        index.add(slot, ident_hash(BlockIdent("b", f"k{slot}", '"e"', slot), index.identity_key),
                  100, slot, (slot,))
        policy.insert(slot, index.fingerprint_of(slot))
    policy.touch(2)
    free = array("i", range(SLOTS - 1, 5, -1))
    save(directory, slab, index, policy, free, 42)
    return slab, (directory / SNAPSHOT_FILE_NAME).read_bytes()


with tempfile.TemporaryDirectory() as _made:
    _, VALID_SNAPSHOT = snapshot_of_a_small_index(Path(_made))


def resealed(snapshot: bytes, edits: list[tuple[int, int]], head_edits: list[tuple[int, int]]
             ) -> bytes:
    """`snapshot` with body bytes and header fields changed, both checksums right."""
    fields = list(_HEAD.unpack_from(snapshot))
    body = bytearray(snapshot[_HEAD.size + 8:])
    for at, value in edits:
        # Negative: from the end, where the links, states and free stack lie
        # (hypothesis favours small numbers, which alone would hit the tags).
        body[at % len(body)] = value
    for field, value in head_edits:
        at = 11 + field % 9  # count, bytes, free count (u64), then the queues (i64)
        fields[at] = value % 2**64 if at < 14 else value
    fields[-1] = xxhash.xxh3_64_intdigest(bytes(body))
    head = _HEAD.pack(*fields)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head)) + bytes(body)


def take_over(change: Callable[[bytes], bytes]) -> None:
    """Save a snapshot beside a slab, `change` it, and take it over."""
    with tempfile.TemporaryDirectory() as made:
        directory = Path(made)
        # The snapshot names its slab file (inode, size, time): made afresh here.
        slab, valid = snapshot_of_a_small_index(directory)
        snapshot = change(valid)
        (directory / SNAPSHOT_FILE_NAME).write_bytes(snapshot)
        taken = take(directory, slab, SLOTS, BLOCK, chunk_size_for(BLOCK))
        assert not (directory / SNAPSHOT_FILE_NAME).exists()
        if taken.restored is None:
            assert taken.reason is not None or snapshot == b""
            return
        restored = taken.restored
        # Used as the store uses it: nothing reaches outside the arrays.
        for slot in range(SLOTS):
            restored.index.holds(slot)
            restored.policy.segment_of(slot)
        for segment in ("small", "main"):
            assert all(0 <= slot < SLOTS for slot in restored.policy.queue(segment))
        assert all(0 <= slot < SLOTS for slot in restored.free)


def test_the_valid_snapshot_is_taken_over() -> None:
    with tempfile.TemporaryDirectory() as made:
        directory = Path(made)
        slab, _ = snapshot_of_a_small_index(directory)
        taken = take(directory, slab, SLOTS, BLOCK, chunk_size_for(BLOCK))
        assert taken.restored is not None and len(taken.restored.index) == 6


def test_a_snapshot_cut_inside_its_header_is_said_to_be_cut_short() -> None:
    with tempfile.TemporaryDirectory() as made:
        directory = Path(made)
        slab, valid = snapshot_of_a_small_index(directory)
        (directory / SNAPSHOT_FILE_NAME).write_bytes(valid[:40])
        taken = take(directory, slab, SLOTS, BLOCK, chunk_size_for(BLOCK))
        assert taken.restored is None
        assert taken.reason is not None and "cut short: 40 bytes" in taken.reason


# Each example saves and takes a snapshot on disk: a quarter of the profile's examples.
FEWER = settings(max_examples=max(10, settings.default.max_examples // 4))


@FEWER
@given(st.lists(st.tuples(st.integers(-400, len(VALID_SNAPSHOT)), st.integers(0, 255)),
                max_size=6),
       st.lists(st.tuples(st.integers(0, 8), st.integers(-2**40, 2**40)), max_size=2))
def test_a_resealed_snapshot_is_taken_over_only_if_it_fits(
    edits: list[tuple[int, int]], head_edits: list[tuple[int, int]],
) -> None:
    take_over(lambda valid: resealed(valid, edits, head_edits))


@FEWER
@given(st.binary(max_size=600), st.integers(0, len(VALID_SNAPSHOT)))
def test_any_snapshot_file_is_taken_or_refused(junk: bytes, cut: int) -> None:
    take_over(lambda valid: junk)
    take_over(lambda valid: valid[:cut])
