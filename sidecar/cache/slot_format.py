"""The slab's on-disk format: every byte of it, encoded and decoded here.

Pure: this module reads and writes bytes in memory, never the file
(``sidecar.cache.slab`` does the I/O, ``sidecar.cache.slab_file`` opens and
resizes the file, ``sidecar.cache.header_scan`` reads the slot headers back).

All blocks live in ONE file, ``slab.dat`` in the cache directory, created at its
full size up front (``posix_fallocate``) so that a too-small disk fails at
startup rather than halfway through a busy day, and so that the file system
can lay it out contiguously. Every slot holds at most one block.

File layout (all integers little-endian)
========================================

The file is ``4096 + slot_count * (4096 + block_size)`` bytes::

    offset                                  size        content
    0                                       4096        file header
    4096 + i * (4096 + block_size)          4096        slot i header
    4096 + i * (4096 + block_size) + 4096   block_size  slot i data

``block_size`` is a multiple of 4096, so every data area starts on a page
boundary: a data page never shares a page with a header.

File header (first 4096 bytes)::

    offset  size  field
    0       8     magic b"KCSLAB01"
    8       2     format version, u16 = 2
    10      2     reserved, zero
    12      4     slot header size, u32 = 4096
    16      8     block_size, u64 (multiple of 4096, at most 256 MiB)
    24      8     slot_count, u64
    32      8     epoch, u64 (see "Generations" below)
    40      8     xxh64 (seed 0) of bytes 0..39
    48      4048  zero

Version 1 (before the epoch) had the xxh64 of bytes 0..31 at offset 32. A
version-1 file is read as epoch 0: its generations are the plain counter of
that version, which starts at 1 and never came near 2**40 (see below), so they
are exactly the generations of epoch 0. The first start that scans it writes a
version-2 header (epoch 1) in its place, nothing else changes: slots and slot
headers are the same in both versions. A version-2 file met by a sidecar that
knows only version 1 is "not a slab header" to it and recreated empty: a
downgrade costs the cached blocks, never wrong bytes.

Slot header (first 4096 bytes of each slot)::

    offset          size   field
    0               4      magic b"SLOT"
    4               2      version, u16 = 1
    6               2      flags, u16: bit 0 = valid; other bits zero
    8               4      data_length, u32 (<= block_size)
    12              8      block_index, u64 (the block's number within its object)
    20              8      generation, u64 (slab-wide monotonic write counter)
    28              4      chunk_size, u32 = min(1 MiB, block_size)
    32              2      chunk_count, u16 = ceil(data_length / chunk_size)
    34              2      bucket_len, u16 (<= 63)
    36              2      key_len, u16 (<= 1024)
    38              2      etag_len, u16 (<= 256)
    40              B      bucket, UTF-8 (B = bucket_len)
    40+B            K      key, UTF-8 (K = key_len)
    40+B+K          E      etag, UTF-8 (E = etag_len)
    V = 40+B+K+E    8*C    chunk checksums, u64 each (C = chunk_count): xxh3_64
                           (seed 0) of data[j*chunk_size : min((j+1)*chunk_size,
                           data_length)] for chunk j
    H = V+8*C       8      xxh3_64 (seed 0) of header bytes 0..H-1
    H+8             rest   unspecified (leftovers of older headers); ignored

With the limits above H+8 <= 40+63+1024+256+8*256+8 = 3439, so a header always
fits its 4096 bytes. A slot holds a block iff its header has the magic, version
1, the valid flag, sane lengths and a matching header checksum; its data is
trusted only chunk by chunk, when each chunk matches its checksum.

Writing a slot, and what a crash leaves behind
==============================================

A slot is written in three steps, always in this order, by ``write_block``
for a block in hand, or by ``write_chunk`` (steps 1 and 2, chunk by chunk as
a fetch brings them) and then ``seal`` (step 3):

1. clear the valid flag (2 bytes at offset 6 of the header);
2. write the data;
3. write the whole new header: names, chunk checksums, valid flag, header
   checksum.

What a process crash (``kill -9``, OOM kill) at each point leaves, and what
the next start's recovery (``sidecar.cache.slab_file``) makes of it:

    crash                          on disk                      recovery
    before step 1                  old header, old data         old block, intact
    after 1, during or after 2     flag clear, any data         empty slot
    during 3 (torn header)         checksum does not match      corrupt: dropped, counted
    after 3                        new header, new data         new block, intact

The store also clears the flag (``invalidate``) before it reuses a slot whose
block was purged, replaced or failed its checksum, and a recovered slot that is
dropped gets its header erased (``erase_header``). A crash before such a clear
reached the page cache leaves a valid header of a block that was dropped in
memory: it is recovered as cached. That is safe because the header still
describes the bytes under it (its chunk checksums), and the ETag in its name
ties it to that version of the object: a rewritten object has another ETag and
never meets the old blocks, a deleted one is a 404 at the origin before any
block is looked up.

Nothing is ever fsynced or msynced: a cache may lose blocks, it must never
serve wrong bytes, and correctness never depends on the order in which pages
reach the disk. That matters because only a process crash keeps the writes in
program order (they sit in the kernel's page cache); after a power loss any mix
of old and new pages of a slot may be on disk. A header is trusted only if its
own checksum matches, so a half-written header is no header; data is trusted
only if it matches the chunk checksums of the header that describes it, so an
old header over partly new data (or a new header over old data) fails at the
first read of a bad chunk, which the store turns into a miss, a refetch and a
``sidecar_cache_checksum_failures_total``. A stale header can never vouch for
new data: the data would have to match the old block's xxh3 of every chunk it
is read through. The worst a crash can do is cost a refetch.

The generation orders writes: if two valid headers ever name the same block
(a replacement was written to a new slot while the old slot's invalidation had
not reached disk), the higher generation is the newer one.

Generations
===========

A generation is ``epoch << 40 | counter`` (``generation_of``). The epoch is
in the file header; the counter counts the writes of the process within it.
A start that must scan the slot headers (no usable index snapshot) first
writes the file header with the epoch one higher and makes it durable
(``advance_epoch``: pwrite, then fdatasync) before the store exists, so before
any slot is written in the new epoch. Every generation on disk was then given
out in an earlier epoch (or in epoch 0 by version 1) and is below
``epoch << 40``, the first one of the new epoch, even though the scan, which
goes on while the store serves, has not seen the largest of them yet: a block
written during the scan outranks every older copy of it, whichever slot the
scan finds it in and at whatever start comes next. The epoch must be durable
first because after a power loss the disk may hold slot headers written in the
new epoch without the file header that started it; the next start would
then reuse the epoch and its generations could tie the old ones (a tie is
resolved by slot number: a duplicate holds the same bytes, so either copy is
right, but the order would no longer be the write order).

A start from the index snapshot keeps the epoch and resumes the counter the
snapshot saved (the snapshot exists only if the process that wrote it stopped
cleanly, so it saw every generation it gave out). 2**40 writes within one
epoch (a thousand billion) are out of reach; 2**24 epochs (starts that scan)
fit a u64 generation.
"""

from __future__ import annotations

import enum
import functools
import struct
import sys
from array import array
from dataclasses import dataclass, field

import xxhash

from sidecar.blocks import MAX_BLOCK_SIZE
from sidecar.cache.ident import BlockIdent, SlotRecord

SLAB_FILE_NAME = "slab.dat"
FILE_MAGIC = b"KCSLAB01"
FORMAT_VERSION = 2
# Generations are ``epoch << COUNTER_BITS | counter`` (see "Generations").
COUNTER_BITS = 40
FILE_HEADER_SIZE = 4096
SLOT_HEADER_SIZE = 4096
SLOT_MAGIC = b"SLOT"
SLOT_VERSION = 1
FLAG_VALID = 0x0001

MAX_CHUNK_SIZE = 1024 * 1024
MAX_BUCKET_BYTES = 63
MAX_KEY_BYTES = 1024
MAX_ETAG_BYTES = 256

# Where the valid flag is in a slot header, and what clears it (step 1).
FLAGS_OFFSET = 6
NOT_VALID = struct.pack("<H", 0)
# The first 8 bytes of a never-written slot (and what erasing a header leaves).
ZEROS_8 = bytes(8)

_FILE_HEADER = struct.Struct("<8sHHIQQ")  # magic .. slot_count: bytes 0..31
_FILE_HEADER_V1_VERSION = 1  # no epoch: the checksum follows slot_count
_SLOT_FIXED = struct.Struct("<4sHHIQQIHHHH")  # magic .. etag_len: bytes 0..39
_U64 = struct.Struct("<Q")
# Bytes of a file header a reader needs: the fields, the epoch and the checksum.
FILE_HEADER_READ = _FILE_HEADER.size + 2 * _U64.size
# The scan copies the little-endian checksums of a header straight into an
# array of native u64.
assert sys.byteorder == "little", "the slab's scan reads little-endian u64s natively"

assert _FILE_HEADER.size == 32 and _SLOT_FIXED.size == 40
# The largest possible header (see above) must fit its page.
assert (
    _SLOT_FIXED.size + MAX_BUCKET_BYTES + MAX_KEY_BYTES + MAX_ETAG_BYTES
    + _U64.size * (MAX_BLOCK_SIZE // MAX_CHUNK_SIZE) + _U64.size
    <= SLOT_HEADER_SIZE
)

def chunk_checksum(data: bytes | memoryview) -> int:
    """xxh3_64 of one data chunk (also the slot header checksum)."""
    return xxhash.xxh3_64_intdigest(data)


def chunk_size_for(block_size: int) -> int:
    return min(MAX_CHUNK_SIZE, block_size)


def slab_file_size(slot_count: int, block_size: int) -> int:
    return FILE_HEADER_SIZE + slot_count * (SLOT_HEADER_SIZE + block_size)



def slot_offset(slot: int, block_size: int) -> int:
    """Where slot ``slot``'s header starts in the file; its data follows it."""
    return FILE_HEADER_SIZE + slot * (SLOT_HEADER_SIZE + block_size)

def encode_file_header(block_size: int, slot_count: int, epoch: int = 0) -> bytes:
    fields = _FILE_HEADER.pack(
        FILE_MAGIC, FORMAT_VERSION, 0, SLOT_HEADER_SIZE, block_size, slot_count
    ) + _U64.pack(epoch)
    return fields + _U64.pack(xxhash.xxh64_intdigest(fields))


def generation_of(epoch: int, counter: int) -> int:
    """The generation of the ``counter``-th write of ``epoch`` (see "Generations")."""
    if not 0 <= counter < 1 << COUNTER_BITS:
        raise ValueError(f"write counter {counter} outside its {COUNTER_BITS} bits")
    return epoch << COUNTER_BITS | counter


def parse_file_header(head: bytes) -> tuple[int, int, int] | None:
    """``(block_size, slot_count, epoch)`` of a slab file header (version 2, or
    version 1 as epoch 0), or None if it is not one (wrong magic, version or
    slot header size, or a checksum that does not match)."""
    if len(head) < _FILE_HEADER.size + 2 * _U64.size:
        return None
    magic, version, _, header_size, block_size, slot_count = _FILE_HEADER.unpack_from(head)
    if magic != FILE_MAGIC or header_size != SLOT_HEADER_SIZE:
        return None
    if version == _FILE_HEADER_V1_VERSION:
        fields, epoch = head[:_FILE_HEADER.size], 0
    elif version == FORMAT_VERSION:
        fields = head[:_FILE_HEADER.size + _U64.size]
        epoch = _U64.unpack_from(head, _FILE_HEADER.size)[0]
    else:
        return None
    if xxhash.xxh64_intdigest(fields) != _U64.unpack_from(head, len(fields))[0]:
        return None
    return block_size, slot_count, epoch


def encode_slot_header(
    ident: BlockIdent, generation: int, length: int, chunk_size: int, checksums: tuple[int, ...]
) -> bytes:
    """The used part of a valid slot header (bytes 0..H+7 of "Slot header")."""
    bucket = ident.bucket.encode()
    key = ident.key.encode()
    etag = ident.etag.encode()
    for name, value, limit in (
        ("bucket", bucket, MAX_BUCKET_BYTES),
        ("key", key, MAX_KEY_BYTES),
        ("etag", etag, MAX_ETAG_BYTES),
    ):
        if len(value) > limit:
            raise ValueError(f"{name} is {len(value)} bytes in UTF-8, the limit is {limit}")
    if not 0 <= ident.block < 2**64:
        raise ValueError(f"block index {ident.block} does not fit a u64")
    if not 0 <= generation < 2**64:
        raise ValueError(f"generation {generation} does not fit a u64")
    body = b"".join((
        _SLOT_FIXED.pack(
            SLOT_MAGIC, SLOT_VERSION, FLAG_VALID, length, ident.block, generation,
            chunk_size, len(checksums), len(bucket), len(key), len(etag),
        ),
        bucket,
        key,
        etag,
        struct.pack(f"<{len(checksums)}Q", *checksums),
    ))
    return body + _U64.pack(chunk_checksum(body))


class HeaderState(enum.Enum):
    """What a slot header that describes no block is, for recovery's counts."""

    EMPTY = "empty"  # zeros (never written, space given back), or its valid flag is clear
    CORRUPT = "corrupt"  # claims a block (or is not zeros) but fails a check: dropped


def decode_slot_header(header: bytes, slot: int, block_size: int) -> SlotRecord | None:
    """The block a slot header describes, or None if it describes none."""
    result = inspect_slot_header(header, slot, block_size)
    return result if isinstance(result, SlotRecord) else None


def inspect_slot_header(
    header: bytes, slot: int, block_size: int
) -> SlotRecord | HeaderState:
    """The block a slot header describes, or why it describes none."""
    parsed = parse_slot_header(header, block_size, chunk_size_for(block_size))
    if isinstance(parsed, HeaderState):
        return parsed
    length, block, generation, chunk_count, bucket, key, etag, names_end = parsed
    return SlotRecord(
        BlockIdent(bucket.decode(), key.decode(), etag.decode(), block), slot, length,
        generation, _checksums_struct(chunk_count).unpack_from(header, names_end),
    )


def parse_slot_header(
    header: bytes, block_size: int, expected_chunk_size: int,
) -> tuple[int, int, int, int, bytes, bytes, bytes, int] | HeaderState:
    """(length, block, generation, chunk_count, bucket, key, etag, names_end) of
    a valid header, names checked to be UTF-8; or why it is not one."""
    # The cheap checks come first: only a header that passes magic, version
    # and lengths is hashed.
    if header[:4] != SLOT_MAGIC:
        # Zeros are a slot never written (or a punched hole); anything else in
        # the magic is damage (a stray write, a torn page after a power loss).
        return HeaderState.EMPTY if header[:8] == ZEROS_8 else HeaderState.CORRUPT
    if len(header) < _SLOT_FIXED.size:
        return HeaderState.CORRUPT
    (
        _, version, flags, length, block, generation,
        chunk_size, chunk_count, bucket_len, key_len, etag_len,
    ) = _SLOT_FIXED.unpack_from(header)
    if not flags & FLAG_VALID:
        # Invalidated, or a write that had cleared the flag and then stopped
        # (step 1 of write_block): an empty slot, not damage.
        return HeaderState.EMPTY
    if version != SLOT_VERSION or flags != FLAG_VALID:
        return HeaderState.CORRUPT
    if (
        length > block_size
        or chunk_size != expected_chunk_size
        or chunk_count != -(-length // chunk_size)
        or bucket_len > MAX_BUCKET_BYTES
        or key_len > MAX_KEY_BYTES
        or etag_len > MAX_ETAG_BYTES
    ):
        return HeaderState.CORRUPT
    names_end = _SLOT_FIXED.size + bucket_len + key_len + etag_len
    body_end = names_end + _U64.size * chunk_count
    if body_end + _U64.size > len(header):
        return HeaderState.CORRUPT
    if xxhash.xxh3_64_intdigest(header[:body_end]) != _U64.unpack_from(header, body_end)[0]:
        return HeaderState.CORRUPT
    names = header[_SLOT_FIXED.size:names_end]
    # One decode of the three names instead of three: valid UTF-8 cut where
    # no character continues (no 0b10xxxxxx byte) is valid UTF-8 piece by piece.
    try:
        names.decode()
    except UnicodeDecodeError:
        return HeaderState.CORRUPT
    key_end = bucket_len + key_len
    if (bucket_len < len(names) and names[bucket_len] & 0xC0 == 0x80) or \
            (key_end < len(names) and names[key_end] & 0xC0 == 0x80):
        return HeaderState.CORRUPT
    return (length, block, generation, chunk_count, names[:bucket_len],
            names[bucket_len:key_end], names[key_end:], names_end)


@functools.cache
def _checksums_struct(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}Q")


@dataclass(frozen=True)
class SlotScan:
    """The valid slot headers of a run of slots, as ``sidecar.cache.header_scan`` found them:
    entry i is slot ``slots[i]``, its identity hash (``sidecar.cache.index``)
    is ``hashes[12*i:12*i+12]``, its checksums ``checksums[C*i:C*i+n]`` (C the
    chunks of a whole block, n those of ``lengths[i]`` bytes). Flat arrays:
    no object per block, even for millions of slots."""

    slots: array[int]
    generations: array[int]
    lengths: array[int]
    hashes: bytearray
    checksums: array[int]
    main: bytearray  # 1 for the blocks the scan's ``admit_to_main`` picked
    corrupt: list[int]  # slots whose header claims a block but fails a check
    # Slots whose header holds no block (zeros, or the valid flag clear).
    empty: array[int] = field(default_factory=lambda: array("I"))
    # Slots whose header the disk failed to read (EIO): neither free nor
    # indexed, out of use until a start scans the headers again (a start from
    # the index snapshot keeps them out: a bad sector is best left alone).
    unreadable: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.slots)
