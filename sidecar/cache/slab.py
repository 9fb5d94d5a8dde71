"""The slab: one preallocated file of fixed-size slots, read and written.

Every byte of the file is ``sidecar.cache.slot_format``'s (the layout, the
three steps of a write and what a crash leaves, the generations); how the file
is found, kept, resized or created at open is ``sidecar.cache.slab_file``'s,
and the scan of the slot headers after a crash ``sidecar.cache.header_scan``'s.

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
goes past the page cache, through a second descriptor opened with O_DIRECT
(``sidecar.cache.direct_io``):
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
steps of a write (``sidecar.cache.slot_format``) keep their order; a direct
write may reach the disk before the flag cleared ahead of it, which is the
power-loss case already covered (an old header over new data fails at its
first chunk read).

Why past the page cache: a cold replay's buffered writes cost most in fresh
page-cache pages (a page the kernel takes afresh costs a virtual machine a
fault on its host), and every page written or read had to be dropped again so
as not to crowd out the broker's (bench/ANALYSIS.md has the figures).

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
import errno
import itertools
import os
from collections.abc import Callable
from io import FileIO
from pathlib import Path
from typing import NamedTuple

from sidecar.cache.direct_io import DirectIO
from sidecar.cache.errors import ChecksumMismatch
from sidecar.cache.header_scan import scan_headers
from sidecar.cache.ident import BlockIdent, SlotRecord
from sidecar.cache.slab_file import Opening, open_direct, prepare
from sidecar.cache.slab_file import pwrite_all as _pwrite_all  # the crash tests stop it
from sidecar.cache.slot_format import (
    FLAGS_OFFSET,
    NOT_VALID,
    SLOT_HEADER_SIZE,
    ZEROS_8,
    SlotScan,
    chunk_checksum,
    chunk_size_for,
    decode_slot_header,
    encode_file_header,
    encode_slot_header,
    generation_of,
    slot_offset,
)

# preadv2(2) flag: fail with EAGAIN rather than wait for the disk. Kernels
# before 4.14 and some file systems refuse the flag itself.
_RWF_NOWAIT = getattr(os, "RWF_NOWAIT", 0x00000008)
_NOWAIT_UNSUPPORTED = (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS)


class NotResident(Exception):
    """Bytes asked for without waiting for the disk are not all in the page cache."""


class ChunkWritten(NamedTuple):
    """A chunk written into its slot: its checksum, and whether its bytes went
    past the page cache (a block's short last chunk, or a file system that
    refuses O_DIRECT, leaves pages there to write back)."""

    checksum: int
    direct: bool


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
        self._direct = DirectIO(path, direct, read_buffers, self._chunk_size)

    @classmethod
    def open(
        cls, directory: Path, slot_count: int, block_size: int, preallocate: bool = True,
        direct_io: bool = False, read_buffers: int = 0,
    ) -> Slab:
        """Open or create the slab file. Blocking: call from an executor.

        ``preallocate``: see ``sidecar.cache.slab_file.prepare``.
        ``direct_io``: chunk data goes past the page cache where it can
        (this module's docstring); the buffers of such reads are reused, ``read_buffers``
        of them at most (``sidecar.cache.read_buffers``).
        """
        path, opening = prepare(directory, slot_count, block_size, preallocate)
        file = FileIO(path, "r+")
        return cls(
            path=path, file=file, slot_count=slot_count, block_size=block_size,
            opening=opening, direct=open_direct(path) if direct_io else None,
            read_buffers=read_buffers,
        )

    @property
    def path(self) -> Path:
        return self._path

    def stat(self) -> os.stat_result:
        """The open file's inode, size and times: those of the file this slab
        reads and writes, whatever is at ``path`` now. Blocking."""
        return os.fstat(self._fd)

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
        """Whether chunk data is written and read past the page cache (``DirectIO``)."""
        return self._direct.enabled

    @property
    def opening(self) -> Opening:
        """What open() found, and which slots may hold blocks from before."""
        return self._opening

    @property
    def epoch(self) -> int:
        """The file header's epoch (slot_format.py, "Generations")."""
        return self._epoch

    def first_generation(self) -> int:
        """The first generation of the file header's epoch (slot_format.py, "Generations")."""
        return generation_of(self._epoch, 1)

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
            _pwrite_all(self._fd, NOT_VALID, base + FLAGS_OFFSET)
            _pwrite_all(self._fd, view, base + SLOT_HEADER_SIZE)
            _pwrite_all(self._fd, header, base)
        return SlotRecord(ident, slot, length, generation, checksums)

    def write_chunk(self, slot: int, offset: int, data: memoryview, first: bool) -> ChunkWritten:
        """Steps 1 (when `first`) and 2 for one chunk of a block arriving in pieces:
        its bytes at `offset` of the slot's data; returns the chunk's checksum
        and whether its bytes went past the page cache.

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
            _pwrite_all(self._fd, NOT_VALID, base + FLAGS_OFFSET)
        checksum = chunk_checksum(data)
        at = base + SLOT_HEADER_SIZE + offset
        direct = self._direct.write(data, at)
        if not direct:
            _pwrite_all(self._fd, data, at)
        return ChunkWritten(checksum, direct)

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
        views = self._direct.read(lengths, at)
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
        return self._direct.copy_of(data)

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
        self, first: int, stop: int, identity_key: bytes,
        admit_to_main: Callable[[BlockIdent], bool] | None = None,
        *, advised: int = 0, ahead: int = 0,
    ) -> SlotScan:
        """The slot headers of slots ``first..stop-1``, their identities hashed
        with ``identity_key`` (recovery; see
        ``sidecar.cache.header_scan.scan_headers``). Blocking."""
        if self._closed:
            raise ValueError("slab is closed")
        return scan_headers(self._fd, self._slot_count, self._block_size, first, stop,
                            identity_key, admit_to_main, advised=advised, ahead=ahead)

    def erase_header(self, slot: int) -> None:
        """Zero the magic, version and flags of the slot's header: an empty slot
        from now on, also for the next recovery. Blocking: call from an executor."""
        self._check_slot(slot)
        _pwrite_all(self._fd, ZEROS_8, self._slot_offset(slot))

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
        _pwrite_all(self._fd, NOT_VALID, self._slot_offset(slot) + FLAGS_OFFSET)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._file.close()
        self._direct.close()

    def _slot_offset(self, slot: int) -> int:
        return slot_offset(slot, self._block_size)

    def _check_slot(self, slot: int) -> None:
        if self._closed:
            raise ValueError("slab is closed")
        if not 0 <= slot < self._slot_count:
            raise IndexError(f"slot {slot} outside 0..{self._slot_count - 1}")


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
