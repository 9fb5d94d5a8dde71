"""The on-disk slab: one preallocated file of fixed-size slots.

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
the next start's recovery (below) makes of it:

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

Reopening (warm restart)
========================

``Slab.open`` looks at an existing file before using it (``Opening``):

- same file header and size: reused as it is, every slot kept;
- same block size, other slot count (the cache was resized): the file is cut
  or extended to the new size and the slots below both counts are kept. Slot
  offsets depend only on the block size, and every slot header stands alone;
- a good file header but a file shorter (or longer) than it says (truncated):
  the slots wholly inside the file are kept, the file is cut to them and
  extended again with zeros (empty slots), reported as damage;
- no file, a damaged or foreign file header, another block size: the file is
  truncated and recreated, the file header being written last so that a crash
  during creation leaves a file that is recreated again at the next start.

In every case but the first the new file header is written last; a crash
before it leaves a header that disagrees with the size, and the next open
repeats the decision, keeping no more slots than this one did.

After a clean stop the store takes over the index it saved then
(``sidecar.cache.snapshot``) and reads no slot header. Otherwise it recovers
its index from the kept slots (``scan``; see ``sidecar.cache.recovery``), in
batches, in the background while it already serves: one 4 KiB header read per
slot, the batch's headers asked of the disk first (``POSIX_FADV_WILLNEED``,
one hint per header: they lie a block apart, and a hint over the batch's range
would read the blocks' data too); zeros and clear flags are empty slots,
valid headers come back as cached blocks (into flat arrays, ``SlotScan``:
identity hash, length, generation, checksums), anything else that claims a
block is corrupt and dropped. Duplicates keep the higher generation, and the
epoch (above) makes a block written after the restart outrank older copies.
Data is not read at start: every read verifies the chunks it touches, which
catches data torn by a crash or rotted on the disk.

I/O
===

Every read and write is a system call on the file (pread, pwrite); the file is
not mapped, and no byte of it is ever handed to a socket by reference. A read
(``read_verified``) copies the chunks the range overlaps out of the page cache
into a new buffer, hashes them there against their checksums and returns a
view of the range: what is served is exactly what was verified. (sendfile(2)
would not be: the socket keeps references to the page-cache pages until the
peer has read them, so a slot rewritten after the send returned can still
change what a slow client receives. A mapping would cost more than it saves: a
failing disk under a mapped page is a SIGBUS that ends the process, where a
read is an EIO the store turns into a miss, and mapped pages are not dropped by
``POSIX_FADV_DONTNEED``.) A chunk is hashed once while in hand when it is
written (``write_chunk``), never read back for that.

With ``direct_io`` (the ``direct_io`` option, on by default) the chunks' data
goes past the page cache, through a second descriptor opened with O_DIRECT:
``write_chunk`` writes a chunk that way whenever its buffer starts on a page
boundary and its length is a whole number of pages (the offset always is one:
slot data starts on a page, chunks are multiples of 4096 bytes), and
``read_direct`` reads a run of chunks into page-aligned buffers of their own
(reused once nothing refers to them, ``sidecar.cache.read_buffers``). Anything
else is an ordinary write or read: a block's short last chunk, a caller's
unaligned buffer, a file system that refuses O_DIRECT at open or at the first
call (from then on everything goes through the page cache). The kernel keeps
the two kinds coherent: a direct write drops the range's cached pages, and a
buffered read after it reads the disk. Headers stay buffered, and the three
steps above keep their order; a direct write may reach the disk before the
flag cleared ahead of it, which is the power-loss case already covered (an old
header over new data fails at its first chunk read).

Why: in this project's benchmark a cold replay's buffered writes cost most
in fresh page-cache pages (a page the kernel takes afresh costs a virtual
machine a fault on its host), and every page written or read had to be
dropped again so as not to crowd out the broker's. `python -m bench.disk_io`
measured 0.05 CPU-seconds a GiB for a direct write against 0.23 for a
buffered one handed back at once, and 0.05 against 0.28 for a read from the
disk (bench/ANALYSIS.md has the replays' side-by-side figures).

Writes may be handed back to the disk and out of the page cache
(``write_back``): written-back pages are clean, and clean pages of a block
nobody reads any more are given back at once instead of crowding out the
broker's own pages (and, on a machine whose memory is lent, instead of growing
the footprint page by page: reusing freed pages is several times cheaper than
taking new ones).

A ``Slab`` is not thread safe by itself: calls on *different* slots may run
concurrently, but the caller (the store) must never overlap a write of a slot
with any other call on that slot, nor ``close`` with anything.
"""

from __future__ import annotations

import ctypes
import enum
import errno
import functools
import itertools
import logging
import os
import struct
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from io import FileIO
from pathlib import Path

import xxhash

from sidecar.aligned import PAGE_SIZE, page_aligned
from sidecar.blocks import MAX_BLOCK_SIZE
from sidecar.cache.errors import ChecksumMismatch
from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.index import block_hash, object_hash
from sidecar.cache.read_buffers import ReadBuffers

log = logging.getLogger(__name__)

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

_FILE_HEADER = struct.Struct("<8sHHIQQ")  # magic .. slot_count: bytes 0..31
_FILE_HEADER_V1_VERSION = 1  # no epoch: the checksum follows slot_count
_SLOT_FIXED = struct.Struct("<4sHHIQQIHHHH")  # magic .. etag_len: bytes 0..39
_U64 = struct.Struct("<Q")
_FLAGS_OFFSET = 6
_NAME_LENGTHS_OFFSET = 34
_NOT_VALID = struct.pack("<H", 0)
_ZEROS_8 = bytes(8)
_SCAN_BATCH = 1024  # slot headers asked of the disk at once by Slab.scan
# Slab.scan copies the little-endian checksums of a header straight into an
# array of native u64.
assert sys.byteorder == "little", "the slab's scan reads little-endian u64s natively"

assert _FILE_HEADER.size == 32 and _SLOT_FIXED.size == 40
# The largest possible header (see the module docstring) must fit its page.
assert (
    _SLOT_FIXED.size + MAX_BUCKET_BYTES + MAX_KEY_BYTES + MAX_ETAG_BYTES
    + _U64.size * (MAX_BLOCK_SIZE // MAX_CHUNK_SIZE) + _U64.size
    <= SLOT_HEADER_SIZE
)


# preadv2(2) flag: fail with EAGAIN rather than wait for the disk. Kernels
# before 4.14 and some file systems refuse the flag itself.
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0x00000008)
_NOWAIT_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


class NotResident(Exception):
    """Bytes asked for without waiting for the disk are not all in the page cache."""


def chunk_checksum(data: bytes | memoryview) -> int:
    """xxh3_64 of one data chunk (also the slot header checksum)."""
    return xxhash.xxh3_64_intdigest(data)


def chunk_size_for(block_size: int) -> int:
    return min(MAX_CHUNK_SIZE, block_size)


def slab_file_size(slot_count: int, block_size: int) -> int:
    return FILE_HEADER_SIZE + slot_count * (SLOT_HEADER_SIZE + block_size)


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


def encode_slot_header(
    ident: BlockIdent, generation: int, length: int, chunk_size: int, checksums: tuple[int, ...]
) -> bytes:
    """The used part of a valid slot header (bytes 0..H+7 of the docstring)."""
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
    parsed = _parse(header, block_size, chunk_size_for(block_size))
    if isinstance(parsed, HeaderState):
        return parsed
    length, block, generation, chunk_count, bucket, key, etag, names_end = parsed
    return SlotRecord(
        BlockIdent(bucket.decode(), key.decode(), etag.decode(), block), slot, length,
        generation, _checksums_struct(chunk_count).unpack_from(header, names_end),
    )


def _parse(
    header: bytes, block_size: int, expected_chunk_size: int,
) -> tuple[int, int, int, int, bytes, bytes, bytes, int] | HeaderState:
    """(length, block, generation, chunk_count, bucket, key, etag, names_end) of
    a valid header, names checked to be UTF-8; or why it is not one."""
    # The cheap checks come first: only a header that passes magic, version
    # and lengths is hashed.
    if header[:4] != SLOT_MAGIC:
        # Zeros are a slot never written (or a punched hole); anything else in
        # the magic is damage (a stray write, a torn page after a power loss).
        return HeaderState.EMPTY if header[:8] == _ZEROS_8 else HeaderState.CORRUPT
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
    """The valid slot headers of a run of slots, as ``Slab.scan`` found them:
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

    def __len__(self) -> int:
        return len(self.slots)


@dataclass(frozen=True)
class Opening:
    """What ``Slab.open`` found and did with the file, for the recovery report.

    ``state`` is one of:

    created    there was no slab file
    reused     the file had this geometry; every slot may hold a block
    resized    the cache size changed (same block size): slots below both the
               old and the new slot count were kept, the file cut or extended
    truncated  the file header is good but the file is not as long as its
               geometry says: the slots wholly present were kept
    recreated  the file header is damaged, not a slab header, or of another
               block size: nothing was kept
    """

    state: str
    reason: str | None
    kept_slots: int  # slots 0..kept_slots-1 may hold blocks; the others are empty
    damaged: bool = False  # blocks were lost to damage, not to a configuration change
    epoch: int = 0  # the file header's epoch (0: a new file, or a version-1 header)


class Slab:
    """``slot_count`` slots of ``block_size`` bytes in ``directory/slab.dat``."""

    def __init__(
        self,
        *,
        path: Path,
        file: FileIO,
        slot_count: int,
        block_size: int,
        opening: Opening,
        direct: int | None = None,
        read_buffers: int = 0,
    ) -> None:
        # Use Slab.open; this only adopts an already opened file.
        self._path = path
        self._file = file
        self._fd = file.fileno()
        self._slot_count = slot_count
        self._block_size = block_size
        self._chunk_size = chunk_size_for(block_size)
        self._opening = opening
        self._epoch = opening.epoch
        self._closed = False
        self._nowait = True  # reads that only take what is in the page cache work here
        # The file opened with O_DIRECT for chunk data, and whether writes
        # through it still work (the descriptor is closed only with the slab:
        # other threads may be writing through it).
        self._direct_fd = direct
        self._direct = direct is not None
        self._read_buffers = ReadBuffers(read_buffers, self._chunk_size)

    @classmethod
    def open(
        cls, directory: Path, slot_count: int, block_size: int, preallocate: bool = True,
        direct_io: bool = False, read_buffers: int = 0,
    ) -> Slab:
        """Open or create the slab file. Blocking: call from an executor.

        Without ``preallocate`` the file is sparse: its blocks are allocated as
        slots are first written (thin volumes, or copy-on-write file systems
        where preallocation does not reserve space for overwrites anyway).
        ``direct_io``: chunk data goes past the page cache where it can
        (see "I/O"); the buffers of such reads are reused, ``read_buffers``
        of them at most (``sidecar.cache.read_buffers``).
        """
        _check_geometry(slot_count, block_size)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / SLAB_FILE_NAME
        size = slab_file_size(slot_count, block_size)
        opening = _inspect_file(path, slot_count, block_size)
        file_header = encode_file_header(block_size, slot_count, opening.epoch)
        if opening.state in ("created", "recreated"):
            _create(path, size, file_header, preallocate)
        elif opening.state != "reused":
            _resize(path, size, file_header, opening.kept_slots, block_size, preallocate)
        file = FileIO(path, "r+")
        return cls(
            path=path, file=file, slot_count=slot_count, block_size=block_size,
            opening=opening, direct=_open_direct(path) if direct_io else None,
            read_buffers=read_buffers,
        )

    @property
    def path(self) -> Path:
        return self._path

    @property
    def slot_count(self) -> int:
        return self._slot_count

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def chunk_size(self) -> int:
        return self._chunk_size

    @property
    def reused(self) -> bool:
        """Whether open() kept the file (whole, or some of its slots) rather than
        creating it afresh."""
        return self._opening.state not in ("created", "recreated")

    @property
    def direct_io(self) -> bool:
        """Whether chunk data is written and read past the page cache (see "I/O")."""
        return self._direct

    @property
    def opening(self) -> Opening:
        """What open() found, and which slots may hold blocks from before."""
        return self._opening

    @property
    def epoch(self) -> int:
        """The file header's epoch (see "Generations")."""
        return self._epoch

    def advance_epoch(self) -> int:
        """Write the file header with the next epoch and make it durable before
        returning it (fdatasync): no slot may be written in an epoch the disk
        does not have yet. Blocking: call from an executor, before any write."""
        if self._closed:
            raise ValueError("slab is closed")
        epoch = self._epoch + 1
        _pwrite_all(self._fd, encode_file_header(self._block_size, self._slot_count, epoch), 0)
        os.fdatasync(self._fd)
        self._epoch = epoch
        return epoch

    def write_block(
        self, slot: int, ident: BlockIdent, generation: int, data: bytes | bytearray | memoryview
    ) -> SlotRecord:
        """Store ``data`` as ``ident`` in ``slot``. Blocking: call from an executor."""
        self._check_slot(slot)
        with memoryview(data) as raw, raw.cast("B") as view:
            length = len(view)
            if length > self._block_size:
                raise ValueError(f"{length} bytes do not fit a block of {self._block_size}")
            checksums = tuple(
                chunk_checksum(view[offset:offset + self._chunk_size])
                for offset in range(0, length, self._chunk_size)
            )
            # Encoded before the disk is touched: a name over its limit must
            # not leave the slot half-written.
            header = encode_slot_header(ident, generation, length, self._chunk_size, checksums)
            base = self._slot_offset(slot)
            _pwrite_all(self._fd, _NOT_VALID, base + _FLAGS_OFFSET)
            _pwrite_all(self._fd, view, base + SLOT_HEADER_SIZE)
            _pwrite_all(self._fd, header, base)
        return SlotRecord(ident, slot, length, generation, checksums)

    def write_chunk(self, slot: int, offset: int, data: memoryview, first: bool) -> int:
        """Steps 1 (when `first`) and 2 for one chunk of a block arriving in pieces:
        its bytes at `offset` of the slot's data; returns the chunk's checksum.

        `offset` is a multiple of the chunk size and `data` a whole chunk (the
        block's last may be shorter). Several chunks of one slot may be written
        by different threads at once; the caller clears the flag with the first.
        Blocking: call from a worker thread.
        """
        self._check_slot(slot)
        if offset % self._chunk_size or offset + len(data) > self._block_size or \
                len(data) > self._chunk_size:
            raise ValueError(f"not a chunk of slot {slot}: {len(data)} bytes at {offset}")
        base = self._slot_offset(slot)
        if first:
            _pwrite_all(self._fd, _NOT_VALID, base + _FLAGS_OFFSET)
        checksum = chunk_checksum(data)
        at = base + SLOT_HEADER_SIZE + offset
        if not self._write_direct(data, at):
            _pwrite_all(self._fd, data, at)
        return checksum

    def _write_direct(self, data: memoryview, at: int) -> bool:
        """Write ``data`` at ``at`` past the page cache if it can be (whole pages
        from a page-aligned buffer); whether it was."""
        fd = self._direct_fd
        if not self._direct or fd is None or len(data) % PAGE_SIZE or not page_aligned(data):
            return False
        try:
            _pwrite_all(fd, data, at)
        except OSError as exc:
            self._direct_refused(exc)
            return False  # the caller writes the same bytes through the page cache
        return True

    def _direct_refused(self, exc: OSError) -> None:
        """A call through the O_DIRECT descriptor failed. EINVAL: the file system
        takes O_DIRECT at open but not this I/O, so everything goes through the
        page cache from now on. Any other error is the disk's, and raised."""
        if exc.errno != errno.EINVAL:
            raise exc
        self._direct = False
        log.info("cache file %s: O_DIRECT refused (%s); reads and writes go through the "
                 "page cache", self._path, exc.strerror)

    def seal(
        self, slot: int, ident: BlockIdent, generation: int, length: int,
        checksums: tuple[int, ...],
    ) -> SlotRecord:
        """Step 3 for a block written with `write_chunk`: its header, which makes
        it a block for recovery. Blocking: call from an executor."""
        self._check_slot(slot)
        if len(checksums) != -(-length // self._chunk_size):
            raise ValueError(f"{len(checksums)} checksums for a block of {length} bytes")
        header = encode_slot_header(ident, generation, length, self._chunk_size, checksums)
        _pwrite_all(self._fd, header, self._slot_offset(slot))
        return SlotRecord(ident, slot, length, generation, checksums)

    def write_back(self, slot: int) -> None:
        """Write the slot's dirty pages to the disk and drop them from the page
        cache (sync_file_range(2), then POSIX_FADV_DONTNEED). Blocking: call
        from an executor; it waits for the disk."""
        self._check_slot(slot)
        offset = self._slot_offset(slot)
        _sync_range(self._fd, offset, SLOT_HEADER_SIZE + self._block_size)
        os.posix_fadvise(self._fd, offset, SLOT_HEADER_SIZE + self._block_size,
                         os.POSIX_FADV_DONTNEED)

    def read_verified(self, slot: int, start: int, end: int, expected: SlotRecord) -> memoryview:
        """Bytes ``start..end-1`` of the block in ``slot``, checked against ``expected``.

        Reads and hashes only the chunks that overlap the range, once. Raises
        ``ChecksumMismatch`` if one of them differs (or comes back short).
        Blocking: call from an executor.
        """
        if expected.slot != slot:
            raise ValueError(f"record of slot {expected.slot} used to read slot {slot}")
        if len(expected.checksums) != -(-expected.length // self._chunk_size):
            raise ValueError("record has the wrong number of chunk checksums for its length")
        return self.read_checked(slot, start, end, expected.length, expected.checksums)

    def read_paged_in(
        self, slot: int, start: int, end: int, expected: SlotRecord
    ) -> memoryview:
        """``read_verified`` of a slot whose pages left the page cache, with the
        rest of the block asked to be read ahead (POSIX_FADV_WILLNEED): a reader
        at its start reads on through it. Blocking: call from an executor."""
        data = self.read_verified(slot, start, end, expected)
        ahead = -(-end // self._chunk_size) * self._chunk_size
        if ahead < expected.length:
            os.posix_fadvise(self._fd, self._slot_offset(slot) + SLOT_HEADER_SIZE + ahead,
                             expected.length - ahead, os.POSIX_FADV_WILLNEED)
        return data

    def read_checked(
        self, slot: int, start: int, end: int, length: int,
        checksums: tuple[int | None, ...] | list[int | None], *, resident: bool = False,
    ) -> memoryview:
        """Like ``read_verified``, against the checksums of the chunks the range
        touches (of a block of ``length`` bytes, maybe still being written).

        ``resident``: only from the page cache, never waiting for the disk
        (preadv2 with RWF_NOWAIT, Linux 4.14); raises NotResident when any of
        it is not there, so that the event loop may call it."""
        self._check_slot(slot)
        if not 0 <= start <= end <= length <= self._block_size:
            raise ValueError(f"range {start}..{end} outside the block's {length} bytes")
        if start == end:
            return memoryview(b"")
        first, last = start // self._chunk_size, (end - 1) // self._chunk_size
        lo = first * self._chunk_size
        hi = min((last + 1) * self._chunk_size, length)
        at_offset = self._slot_offset(slot) + SLOT_HEADER_SIZE + lo
        data: bytes | bytearray
        if resident:
            if not self._nowait:
                raise NotResident(slot)
            data = bytearray(hi - lo)
            try:
                got = os.preadv(self._fd, [data], at_offset, _RWF_NOWAIT)
            except BlockingIOError:
                raise NotResident(slot) from None
            except OSError as exc:
                if exc.errno not in _NOWAIT_UNSUPPORTED:
                    raise
                self._nowait = False  # this kernel or file system cannot: ask no more
                raise NotResident(slot) from None
            if got != hi - lo:
                raise NotResident(slot)  # partly in the page cache, or cut short
        else:
            data = os.pread(self._fd, hi - lo, at_offset)
        view = memoryview(data)
        for chunk in range(first, last + 1):
            at = chunk * self._chunk_size - lo
            piece = view[at:at + min(self._chunk_size, length - chunk * self._chunk_size)]
            # A chunk cut short (a file cut under the cache) is as bad as a wrong one.
            expected = checksums[chunk]
            if expected is None or len(piece) != min(self._chunk_size,
                                                     length - chunk * self._chunk_size) \
                    or chunk_checksum(piece) != expected:
                raise ChecksumMismatch(slot, chunk)
        return view[start - lo:end - lo]

    def read_direct(
        self, slot: int, first: int, stop: int, length: int,
        checksums: tuple[int | None, ...] | list[int | None],
    ) -> list[memoryview]:
        """Chunks ``first..stop-1`` of the block in ``slot`` (``length`` bytes),
        each verified against its checksum, read in one call past the page cache
        (preadv(2) into a page-aligned buffer of its own per chunk) when the
        slab writes that way, else through it. Raises ``ChecksumMismatch``.
        Blocking: call from an executor."""
        self._check_slot(slot)
        size = self._chunk_size
        if not 0 <= first < stop <= -(-length // size) or length > self._block_size:
            raise ValueError(f"chunks {first}..{stop - 1} outside the block's {length} bytes")
        lengths = [min(size, length - chunk * size) for chunk in range(first, stop)]
        at = self._slot_offset(slot) + SLOT_HEADER_SIZE + first * size
        views = self._preadv_direct(lengths, at)
        if views is None:
            data = memoryview(os.pread(self._fd, sum(lengths), at))
            views = [data[offset:offset + n] for offset, n in
                     zip(itertools.accumulate([0, *lengths]), lengths, strict=False)]
        for chunk, view, expected_length in zip(range(first, stop), views, lengths, strict=True):
            expected = checksums[chunk]
            if expected is None or len(view) != expected_length \
                    or chunk_checksum(view) != expected:
                raise ChecksumMismatch(slot, chunk)
        return views

    def copy_of(self, data: memoryview) -> memoryview:
        """``data`` (a chunk at most) copied into one of the read buffers.
        Thread safe, no I/O."""
        if len(data) > self._chunk_size:
            raise ValueError(f"{len(data)} bytes do not fit a chunk of {self._chunk_size}")
        copy = self._read_buffers.take(-(-len(data) // PAGE_SIZE) * PAGE_SIZE)[:len(data)]
        copy[:] = data
        return copy

    def _preadv_direct(self, lengths: list[int], at: int) -> list[memoryview] | None:
        """The chunks read with O_DIRECT (each buffer whole pages; the short last
        chunk's tail is read and cut off), or None where that cannot be done."""
        fd = self._direct_fd
        if not self._direct or fd is None:
            return None
        buffers = [self._read_buffers.take(-(-n // PAGE_SIZE) * PAGE_SIZE) for n in lengths]
        try:
            got = os.preadv(fd, buffers, at)
        except OSError as exc:
            self._direct_refused(exc)
            return None
        views = []
        for buffer, n in zip(buffers, lengths, strict=True):
            views.append(buffer[:max(0, min(n, got))])  # short when the file was cut
            got -= len(buffer)
        return views

    def verify(self, slot: int, start: int, end: int, expected: SlotRecord) -> None:
        """Check the chunks overlapping ``start..end-1`` (the scrub); raises
        ``ChecksumMismatch`` like ``read_verified``. Blocking: call from an executor."""
        if expected.slot != slot:
            raise ValueError(f"record of slot {expected.slot} used to read slot {slot}")
        if len(expected.checksums) != -(-expected.length // self._chunk_size):
            raise ValueError("record has the wrong number of chunk checksums for its length")
        for chunk_start in range(start - start % self._chunk_size, end, self._chunk_size):
            # One chunk at a time: the scrub holds a chunk, not a block, in memory.
            self.read_checked(slot, max(start, chunk_start),
                              min(end, chunk_start + self._chunk_size), expected.length,
                              expected.checksums)

    def read_record(self, slot: int) -> SlotRecord | None:
        """The block the slot's header describes, if valid (for recovery). Blocking."""
        self._check_slot(slot)
        return decode_slot_header(
            os.pread(self._fd, SLOT_HEADER_SIZE, self._slot_offset(slot)), slot,
            self._block_size,
        )

    def scan(
        self, first: int, stop: int,
        admit_to_main: Callable[[BlockIdent], bool] | None = None,
        *, advised: int = 0, ahead: int = 0,
    ) -> SlotScan:
        """The slot headers of slots ``first..stop-1`` (recovery). Blocking.

        A scan in batches keeps the disk reading ahead of it: ``ahead`` slots
        after ``stop`` are hinted too, and the caller says how many slots from
        ``first`` on an earlier call already hinted (``advised``), so that
        each header is hinted once.

        One ``pread`` of a header page per slot rather than the mapping: a read
        releases the GIL while the disk works, so a few threads scanning
        disjoint runs keep the disk busy, and no page fault stalls a thread
        that holds the GIL. Data pages are never read here.
        ``admit_to_main`` marks the blocks the policy keeps out of probation.
        """
        if self._closed:
            raise ValueError("slab is closed")
        if not 0 <= first <= stop <= self._slot_count:
            raise IndexError(f"slots {first}..{stop} outside 0..{self._slot_count}")
        found = SlotScan(array("I"), array("Q"), array("I"), bytearray(), array("Q"),
                         bytearray(), [])
        fd, pread, stride = self._fd, os.pread, SLOT_HEADER_SIZE + self._block_size
        block_size, chunk_size = self._block_size, self._chunk_size
        chunks = -(-block_size // chunk_size)
        padding = [array("Q", [0]) * n for n in range(chunks + 1)]
        # Blocks of one object sit in neighbouring slots more often than not
        # (an object is written front to back): its half of the identity hash
        # is computed once for the run.
        last_bucket, last_key, last_object = b"", b"", b""
        hinted = min(self._slot_count, first + advised)
        for batch in range(first, stop, _SCAN_BATCH):
            # Ask for the next batch (and ``ahead``) before decoding this one:
            # the kernel reads those pages while this thread hashes, many reads
            # in flight at once.
            wanted = min(self._slot_count, min(stop, batch + 2 * _SCAN_BATCH) + ahead)
            if wanted > hinted:
                self._advise_headers(hinted, wanted)
                hinted = wanted
            offset = self._slot_offset(batch)
            for slot in range(batch, min(stop, batch + _SCAN_BATCH)):
                header = pread(fd, SLOT_HEADER_SIZE, offset)
                offset += stride
                if header[:8] == _ZEROS_8:  # the common empty slot, without decoding
                    found.empty.append(slot)
                    continue
                parsed = _parse(header, block_size, chunk_size)
                if parsed is HeaderState.CORRUPT:
                    found.corrupt.append(slot)
                    continue
                if isinstance(parsed, HeaderState):
                    found.empty.append(slot)
                    continue
                length, block, generation, count, bucket, key, etag, names_end = parsed
                if key != last_key or bucket != last_bucket:
                    last_bucket, last_key = bucket, key
                    last_object = object_hash(bucket, key)
                found.slots.append(slot)
                found.generations.append(generation)
                found.lengths.append(length)
                found.hashes.extend(block_hash(last_object, etag, block))
                found.checksums.frombytes(header[names_end:names_end + 8 * count])
                found.checksums.extend(padding[chunks - count])
                found.main.append(admit_to_main is not None and admit_to_main(BlockIdent(
                    bucket.decode(), key.decode(), etag.decode(), block)))
        return found

    def _advise_headers(self, first: int, stop: int) -> None:
        """Start reading the header pages of slots ``first..stop-1`` (readahead(2)
        style, without waiting): one pread after another would wait for each."""
        fd, stride = self._fd, SLOT_HEADER_SIZE + self._block_size
        offset = self._slot_offset(first) if first < stop else 0
        for _ in range(first, stop):
            os.posix_fadvise(fd, offset, SLOT_HEADER_SIZE, os.POSIX_FADV_WILLNEED)
            offset += stride

    def erase_header(self, slot: int) -> None:
        """Zero the magic, version and flags of the slot's header: an empty slot
        from now on, also for the next recovery. Blocking: call from an executor."""
        self._check_slot(slot)
        _pwrite_all(self._fd, _ZEROS_8, self._slot_offset(slot))

    def drop_pages(self, slot: int) -> None:
        """Advise the kernel that the slot's pages are not needed (starts writeback of
        dirty ones, drops clean ones): a big replay must not balloon the node's page
        cache. Blocking: call from an executor."""
        self._check_slot(slot)
        os.posix_fadvise(self._fd, self._slot_offset(slot), SLOT_HEADER_SIZE + self._block_size,
                         os.POSIX_FADV_DONTNEED)

    def release_space(self, slot: int) -> None:
        """Give the slot's disk space back to the file system (punch a hole); the slot
        reads as zeros, an invalid slot, until written again. Blocking."""
        self._check_slot(slot)
        offset = self._slot_offset(slot)
        _punch_hole(self._fd, offset, SLOT_HEADER_SIZE + self._block_size)
        self.drop_pages(slot)

    def invalidate(self, slot: int) -> None:
        """Clear the slot's valid flag. Blocking: call from an executor."""
        self._check_slot(slot)
        _pwrite_all(self._fd, _NOT_VALID, self._slot_offset(slot) + _FLAGS_OFFSET)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._file.close()
        self._direct = False
        if self._direct_fd is not None:
            os.close(self._direct_fd)
            self._direct_fd = None

    def _slot_offset(self, slot: int) -> int:
        return FILE_HEADER_SIZE + slot * (SLOT_HEADER_SIZE + self._block_size)

    def _check_slot(self, slot: int) -> None:
        if self._closed:
            raise ValueError("slab is closed")
        if not 0 <= slot < self._slot_count:
            raise IndexError(f"slot {slot} outside 0..{self._slot_count - 1}")


def _open_direct(path: Path) -> int | None:
    """The slab file opened again with O_DIRECT, or None where the file system
    (or platform) refuses it: reads and writes stay buffered there."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return None
    try:
        return os.open(path, os.O_RDWR | flag | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
        log.info("cache file %s: O_DIRECT refused (%s); reads and writes go through the "
                 "page cache", path, exc.strerror)
        return None


def _check_geometry(slot_count: int, block_size: int) -> None:
    if slot_count < 1:
        raise ValueError(f"slot_count must be at least 1, got {slot_count}")
    if not 0 < block_size <= MAX_BLOCK_SIZE or block_size % PAGE_SIZE:
        raise ValueError(
            f"block_size must be a multiple of {PAGE_SIZE} up to {MAX_BLOCK_SIZE}, "
            f"got {block_size}"
        )


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


def _inspect_file(path: Path, slot_count: int, block_size: int) -> Opening:
    """Decide what to do with an existing file: keep it, keep some slots, or start over.

    Slot offsets depend only on the block size (the slot count only sets where
    the file ends), and every slot header stands on its own, so with the same
    block size any slot wholly inside the file can be kept whatever happened
    to the rest.
    """
    try:
        with FileIO(path, "r") as file:
            size = os.fstat(file.fileno()).st_size
            head = file.read(_FILE_HEADER.size + 2 * _U64.size)
    except FileNotFoundError:
        return Opening("created", None, 0)
    geometry = parse_file_header(head)
    if geometry is None:
        return Opening(
            "recreated",
            f"the file header is damaged or not a slab header ({size}-byte file): "
            "every cached block dropped",
            0,
            damaged=True,
        )
    # The kept slots keep their generations, so the file keeps its epoch; a
    # recreated file starts from nothing on disk, at epoch 0.
    old_block_size, old_slot_count, epoch = geometry
    if old_block_size != block_size:
        return Opening(
            "recreated",
            f"block size changed from {old_block_size} to {block_size}: every cached "
            "block dropped",
            0,
        )
    old_size = slab_file_size(old_slot_count, block_size)
    if old_slot_count == slot_count and size == old_size:
        return Opening("reused", None, slot_count, epoch=epoch)
    present = max(0, (size - FILE_HEADER_SIZE) // (SLOT_HEADER_SIZE + block_size))
    kept = min(old_slot_count, slot_count, present)
    if size != old_size:
        return Opening(
            "truncated",
            f"the file is {size} bytes, its header says {old_size}: kept the {kept} "
            f"slots wholly present, dropped slots {kept}..{old_slot_count - 1}"
            if size < old_size else
            f"the file is {size} bytes, its header says {old_size}: cut the excess",
            kept,
            damaged=True,
            epoch=epoch,
        )
    return Opening(
        "resized", f"cache resized from {old_slot_count} to {slot_count} slots", kept,
        epoch=epoch,
    )


def _resize(
    path: Path, size: int, file_header: bytes, kept_slots: int, block_size: int,
    preallocate: bool,
) -> None:
    # Cut to the kept slots first: whatever lay beyond (a partly present slot,
    # slots of a larger geometry, stray bytes) goes, and the extension reads as
    # zeros, i.e. empty slots. The file header goes last; a crash before it
    # leaves a header that disagrees with the size, and the next open resizes
    # again, keeping no more slots than this one did.
    with FileIO(path, "r+") as file:
        fd = file.fileno()
        os.ftruncate(fd, slab_file_size(kept_slots, block_size))
        if preallocate:
            _preallocate(fd, size)
        else:
            os.ftruncate(fd, size)
        _pwrite_all(fd, file_header, 0)


def _create(path: Path, size: int, file_header: bytes, preallocate: bool) -> None:
    # Truncating first drops every stale slot header of the old geometry; the
    # file header goes last so that an interrupted creation is not reused.
    with FileIO(path, "w") as file:
        if preallocate:
            _preallocate(file.fileno(), size)
        else:
            os.ftruncate(file.fileno(), size)
        _pwrite_all(file.fileno(), file_header, 0)


def _preallocate(fd: int, size: int) -> None:
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, size)
            return
        except OSError as exc:
            # ENOSPC and friends must surface; only "this file system or
            # platform cannot do it" falls back to a (sparse) ftruncate.
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


_FALLOC_FL_KEEP_SIZE = 0x01  # linux/falloc.h
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def _punch_hole(fd: int, offset: int, length: int) -> None:
    # fallocate(2) with flags is not in the os module; the hole keeps the file's
    # size (and every other slot's offset) while freeing its blocks.
    if _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


_SYNC_FILE_RANGE_WAIT_BEFORE = 1  # linux/fs.h
_SYNC_FILE_RANGE_WRITE = 2
_SYNC_FILE_RANGE_WAIT_AFTER = 4
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]


def _sync_range(fd: int, offset: int, length: int) -> None:
    # sync_file_range(2) is not in the os module either. It writes back this
    # range only (fdatasync would wait for the whole slab's dirty pages), and
    # is no durability promise: the slab never relies on one (see above).
    flags = _SYNC_FILE_RANGE_WAIT_BEFORE | _SYNC_FILE_RANGE_WRITE | _SYNC_FILE_RANGE_WAIT_AFTER
    if _libc.sync_file_range(fd, offset, length, flags) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    with memoryview(data) as view:
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
