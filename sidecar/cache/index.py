"""The cache index in memory: which slot holds which block, as flat arrays.

One Python object per cached block (a named tuple of names, a tuple of
checksums, dict and set entries) cost about 680 bytes a slot: 1.4 GB for the
2 million slots of a 16 TiB cache disk. ``SlotIndex`` keeps the same facts in
a few arrays indexed by slot number instead, with no object per block:

    array        bytes a slot   content
    tags         4              bytes 0..3 of the block's identity hash (below)
    hashes       8              bytes 4..11 of it
    lengths      4              data length, u32; 0xFFFFFFFF = no block
    generations  4              low 32 bits of the write's generation, u32
    checksums    8 * C          xxh3_64 of each checksum chunk (C = chunks a block)
    table        5 (load 0.8)   open-addressing table of slot numbers, i32

At 8 MiB blocks (C = 8) that is 89 bytes a slot, whatever the names' lengths.

Identity hash
=============

A block is named by (bucket, key, ETag, block number). The index keeps 12
bytes of it, from two BLAKE2b digests of 8 bytes each, keyed with the index's
``identity_key`` (16 random bytes drawn when the index is made):

    O             BLAKE2b-64(identity_key) of  u16 len(bucket) | u16 len(key) | bucket | key
    bytes 0..3    O[0..3], the object's tag
    bytes 4..11   BLAKE2b-64(identity_key) of  O | u16 len(etag) | u64 block | etag

(lengths and the block little-endian, names in UTF-8; the length prefixes make
the encoding injective). The tag names the object, so that dropping an object
(``slots_of_object``) is a search of the tags, 4 bytes a slot, kept apart
from the rest so that the search reads 8 MB at 2 million slots (a few
milliseconds) rather than the whole index: another object
with the same tag loses its blocks too (a miss, never wrong bytes), with
odds of 2**-32 a block. Bytes 4..11 cover every name: two different blocks
share an identity only if those 64-bit digests collide, about 1e-7 for all
the 2**21 x 2**21 / 2 pairs of a full 2-million-slot cache taken together.

Keyed, because a hit trusts the identity alone (the names stay in the slot
header on disk, where recovery reads them): with an unkeyed 64-bit hash
(xxh3, before) whoever chooses object keys and contents could search offline
for a pair that collides and have their bytes served for the other object.
Without the key, which never leaves the process but in the index snapshot
beside the slab (``sidecar.cache.snapshot``), a collision is a blind guess.
The key lives with the index: a start from the snapshot takes its key, a
start that scans the slot headers draws a new one and hashes the names anew.
The generation is kept to 32 bits: in memory it only tells two writes of a
slot apart (``SlotRecord.generation``); the slab's 64-bit counter is on disk.

The table is linear probing on bytes 4..11 of the hash, deletion by backward
shift (no tombstones), sized 1.25 slots a slot: a lookup that misses probes
a few entries on average, one that hits one or two.

Pure bookkeeping, no I/O: ``sidecar.cache.store`` drives it.
"""

from __future__ import annotations

import hashlib
import secrets
import struct
from array import array
from collections.abc import Sequence

from sidecar.cache.ident import BlockIdent

HASH_BYTES = 12
TAG_BYTES = 4
_LONG_BYTES = HASH_BYTES - TAG_BYTES
NO_BLOCK = 0xFFFFFFFF
_EMPTY = -1
_NAME_LENGTHS = struct.Struct("<HH")
_VERSION = struct.Struct("<HQ")


# Bytes of the identity key (BLAKE2b takes keys of up to 64).
IDENTITY_KEY_BYTES = 16


def new_identity_key() -> bytes:
    return secrets.token_bytes(IDENTITY_KEY_BYTES)


def object_hash(bucket: bytes, key: bytes, identity_key: bytes) -> bytes:
    """O of the identity hash: the object, whatever its version (8 bytes)."""
    return hashlib.blake2b(_NAME_LENGTHS.pack(len(bucket), len(key)) + bucket + key,
                           digest_size=8, key=identity_key).digest()


def block_hash(object_digest: bytes, etag: bytes, block: int, identity_key: bytes) -> bytes:
    """The 12-byte identity hash of a block of the object ``object_digest`` names."""
    return object_digest[:TAG_BYTES] + hashlib.blake2b(
        object_digest + _VERSION.pack(len(etag), block) + etag, digest_size=8,
        key=identity_key).digest()


def ident_hash(ident: BlockIdent, identity_key: bytes) -> bytes:
    return block_hash(object_hash(ident.bucket.encode(), ident.key.encode(), identity_key),
                      ident.etag.encode(), ident.block, identity_key)


def table_size(slot_count: int) -> int:
    """Entries of the table of an index of ``slot_count`` slots (load <= 0.8)."""
    return slot_count + slot_count // 4 + 1


def fingerprint(digest: bytes) -> int:
    """A 64-bit number of an identity hash (the table's and the ghost's)."""
    return int.from_bytes(digest[TAG_BYTES:HASH_BYTES], "little")


class SlotIndex:
    """Slot -> (identity hash, length, chunk checksums), and hash -> slot."""

    def __init__(self, slot_count: int, block_size: int, chunk_size: int,
                 identity_key: bytes | None = None) -> None:
        if slot_count < 1 or not 0 < chunk_size <= block_size:
            raise ValueError("an index needs at least one slot, and chunks within blocks")
        if identity_key is not None and len(identity_key) != IDENTITY_KEY_BYTES:
            raise ValueError(f"an identity key is {IDENTITY_KEY_BYTES} bytes")
        # The key of every identity hash in this index (see "Identity hash").
        self.identity_key = identity_key or new_identity_key()
        self._slots = slot_count
        self._block_size = block_size
        self._chunk_size = chunk_size
        self._chunks = -(-block_size // chunk_size)
        self.tags = bytearray(TAG_BYTES * slot_count)
        self.hashes = bytearray(_LONG_BYTES * slot_count)
        self.lengths = array("I", [NO_BLOCK]) * slot_count
        self.generations = array("I", [0]) * slot_count
        self.checksums = array("Q", [0]) * (self._chunks * slot_count)
        self._table_size = table_size(slot_count)
        self._table = array("i", [_EMPTY]) * self._table_size
        self._count = 0
        self._used_bytes = 0

    @property
    def slot_count(self) -> int:
        return self._slots

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def chunk_size(self) -> int:
        return self._chunk_size

    @property
    def chunks_per_block(self) -> int:
        return self._chunks

    def __len__(self) -> int:
        return self._count

    @property
    def used_bytes(self) -> int:
        return self._used_bytes

    def nbytes(self) -> int:
        """Bytes of the arrays (what the index costs in memory)."""
        return (len(self.tags) + len(self.hashes) + self.lengths.itemsize * len(self.lengths)
                + self.generations.itemsize * len(self.generations)
                + self.checksums.itemsize * len(self.checksums)
                + self._table.itemsize * len(self._table))

    def buffers(self) -> list[array[int] | bytearray]:
        """The arrays of the index, in the index snapshot's order; a snapshot is
        read straight into them (then ``restored``). The table stays valid as
        saved: its positions depend only on the hashes and its size."""
        return [self.tags, self.hashes, self.lengths, self.generations, self.checksums,
                self._table]

    def restored(self, count: int, used_bytes: int) -> None:
        self._count, self._used_bytes = count, used_bytes

    def fingerprint_of(self, slot: int) -> int:
        """``fingerprint`` of the block in ``slot`` (the eviction policy's ghost)."""
        return int.from_bytes(self.hashes[slot * _LONG_BYTES:(slot + 1) * _LONG_BYTES],
                              "little")

    def holds(self, slot: int) -> bool:
        return self.lengths[slot] != NO_BLOCK

    def hash_of(self, slot: int) -> bytes:
        return bytes(self.tags[slot * TAG_BYTES:(slot + 1) * TAG_BYTES]
                     + self.hashes[slot * _LONG_BYTES:(slot + 1) * _LONG_BYTES])

    def length(self, slot: int) -> int:
        return self.lengths[slot]

    def generation(self, slot: int) -> int:
        return self.generations[slot]

    def checksums_of(self, slot: int) -> tuple[int, ...]:
        length = self.lengths[slot]
        if length == NO_BLOCK:
            raise KeyError(f"slot {slot} holds no block")
        first = slot * self._chunks
        return tuple(self.checksums[first:first - (-length // self._chunk_size)])

    def find(self, digest: bytes) -> int:
        """The slot holding the block of this identity hash, or -1."""
        table, size, hashes, tags = self._table, self._table_size, self.hashes, self.tags
        tag, long = digest[:TAG_BYTES], digest[TAG_BYTES:]
        at = fingerprint(digest) % size
        while True:
            slot = table[at]
            if slot == _EMPTY:
                return -1
            if hashes[slot * _LONG_BYTES:(slot + 1) * _LONG_BYTES] == long and \
                    tags[slot * TAG_BYTES:(slot + 1) * TAG_BYTES] == tag:
                return slot
            at = at + 1 if at + 1 < size else 0

    def add(self, slot: int, digest: bytes, length: int, generation: int,
            checksums: Sequence[int]) -> None:
        """Record ``slot`` as holding the block ``digest``; neither may be in use."""
        if self.lengths[slot] != NO_BLOCK:
            raise KeyError(f"slot {slot} already holds a block")
        if not 0 <= length < NO_BLOCK or len(checksums) != -(-length // self._chunk_size) \
                or len(checksums) > self._chunks:
            raise ValueError(f"a block of {length} bytes and {len(checksums)} checksums")
        table, size = self._table, self._table_size
        at = fingerprint(digest) % size
        while table[at] != _EMPTY:
            if self.hash_of(table[at]) == digest:
                raise KeyError("that block is already in the index")
            at = at + 1 if at + 1 < size else 0
        table[at] = slot
        self.tags[slot * TAG_BYTES:(slot + 1) * TAG_BYTES] = digest[:TAG_BYTES]
        self.hashes[slot * _LONG_BYTES:(slot + 1) * _LONG_BYTES] = digest[TAG_BYTES:]
        self.lengths[slot] = length
        self.generations[slot] = generation & 0xFFFFFFFF
        first = slot * self._chunks
        self.checksums[first:first + len(checksums)] = array("Q", checksums)
        self._count += 1
        self._used_bytes += length

    def remove(self, slot: int) -> None:
        """Forget the block of ``slot`` (which must hold one)."""
        length = self.lengths[slot]
        if length == NO_BLOCK:
            raise KeyError(f"slot {slot} holds no block")
        table, size = self._table, self._table_size
        at = fingerprint(self.hash_of(slot)) % size
        while table[at] != slot:
            at = at + 1 if at + 1 < size else 0
        # Backward-shift deletion: move later entries of the run up into the
        # hole when their home position lies at or before it (cyclically).
        hole = at
        at = at + 1 if at + 1 < size else 0
        while table[at] != _EMPTY:
            home = fingerprint(self.hash_of(table[at])) % size
            if (at > hole and (home <= hole or home > at)) or \
                    (at < hole and home <= hole and home > at):
                table[hole] = table[at]
                hole = at
            at = at + 1 if at + 1 < size else 0
        table[hole] = _EMPTY
        self.lengths[slot] = NO_BLOCK
        self._count -= 1
        self._used_bytes -= length

    def slots_of_object(self, object_digest: bytes) -> list[int]:
        """The slots holding blocks of the object ``object_digest`` (O) names, and
        of any other object with its tag."""
        found: list[int] = []
        tags, at, tag = self.tags, 0, object_digest[:TAG_BYTES]
        while True:
            at = tags.find(tag, at)
            if at < 0:
                return found
            if at % TAG_BYTES == 0 and self.lengths[at // TAG_BYTES] != NO_BLOCK:
                found.append(at // TAG_BYTES)
                at += TAG_BYTES
            else:
                at += 1


class SlotBits:
    """One bit a slot (a set of slot numbers in slot_count / 8 bytes)."""

    def __init__(self, slot_count: int) -> None:
        self._bits = bytearray(-(-slot_count // 8))
        self._count = 0

    def __contains__(self, slot: int) -> bool:
        return bool(self._bits[slot >> 3] >> (slot & 7) & 1)

    def __len__(self) -> int:
        return self._count

    def nbytes(self) -> int:
        return len(self._bits)

    def add(self, slot: int) -> None:
        if slot not in self:
            self._bits[slot >> 3] |= 1 << (slot & 7)
            self._count += 1

    def discard(self, slot: int) -> None:
        if slot in self:
            self._bits[slot >> 3] &= ~(1 << (slot & 7)) & 0xFF
            self._count -= 1
