"""The slab file's lifecycle: found, kept, resized or created at open.

Reopening (warm restart)
========================

``Slab.open`` (through ``prepare``) looks at an existing file before using it (``Opening``):

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
its index from the kept slots (``sidecar.cache.header_scan``; see ``sidecar.cache.recovery``), in
batches, in the background while it already serves: one 4 KiB header read per
slot, the batch's headers asked of the disk first (``POSIX_FADV_WILLNEED``,
one hint per header: they lie a block apart, and a hint over the batch's range
would read the blocks' data too); zeros and clear flags are empty slots,
valid headers come back as cached blocks (into flat arrays, ``SlotScan``:
identity hash, length, generation, checksums), anything else that claims a
block is corrupt and dropped. Duplicates keep the higher generation, and the
epoch (slot_format.py, "Generations") makes a block written after the
restart outrank older copies.
Data is not read at start: every read verifies the chunks it touches, which
catches data torn by a crash or rotted on the disk.

The bytes of the file header and of every slot are ``sidecar.cache.slot_format``'s.
"""

from __future__ import annotations

import errno
import logging
import os
from dataclasses import dataclass
from io import FileIO
from pathlib import Path

from sidecar.aligned import PAGE_SIZE
from sidecar.blocks import MAX_BLOCK_SIZE
from sidecar.cache.slot_format import (
    FILE_HEADER_READ,
    FILE_HEADER_SIZE,
    SLAB_FILE_NAME,
    SLOT_HEADER_SIZE,
    encode_file_header,
    parse_file_header,
    slab_file_size,
)

# The slab's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.slab")


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


def prepare(directory: Path, slot_count: int, block_size: int, preallocate: bool
            ) -> tuple[Path, Opening]:
    """Make ``directory/slab.dat`` a slab file of this geometry, keeping what
    can be kept of the one there; its path and what was found. Blocking.

    Without ``preallocate`` the file is sparse: its blocks are allocated as
    slots are first written (thin volumes, or copy-on-write file systems
    where preallocation does not reserve space for overwrites anyway).
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
    return path, opening


def open_direct(path: Path) -> int | None:
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
            head = file.read(FILE_HEADER_READ)
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
        _header_last(fd, file_header)


def _create(path: Path, size: int, file_header: bytes, preallocate: bool) -> None:
    # Truncating first drops every stale slot header of the old geometry; the
    # file header goes last so that an interrupted creation is not reused.
    with FileIO(path, "w") as file:
        if preallocate:
            _preallocate(file.fileno(), size)
        else:
            os.ftruncate(file.fileno(), size)
        _header_last(file.fileno(), file_header)


def _header_last(fd: int, file_header: bytes) -> None:
    """Write the file header once the cut and the extension are on the disk.
    "Last" must hold across a power loss too: a file system need not order a
    size change before a later data write (only ext4's default ordered mode
    does), and a new header over an old size or stale slot headers of another
    geometry would be taken for a kept file. The second sync makes the new
    geometry durable before any slot is written under it. Both at create or
    resize only, never on the serving path."""
    os.fsync(fd)
    pwrite_all(fd, file_header, 0)
    os.fsync(fd)


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



def pwrite_all(fd: int, data: bytes | memoryview, offset: int) -> None:
    with memoryview(data) as view:
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written
