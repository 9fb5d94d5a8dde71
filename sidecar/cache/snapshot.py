"""The index snapshot: the index in memory saved at a clean stop, so that the
next start takes it over instead of scanning every slot header.

Scanning reads one 4 KiB header per slot and decodes it in Python: seconds
per hundred thousand slots. The index is a few flat arrays
(``sidecar.cache.index``, ``sidecar.cache.slot_fifo``), so saving it is
writing those arrays out, and loading it reading them back into arrays of the
same size, with no per-slot work at all.

File ``index.snap`` in the cache directory (integers little-endian)::

    offset  size  field
    0       8     magic b"KCINDEX1"
    8       2     format version, u16 = 2
    10      2     identity hash bytes, u16 = 12
    12      4     chunks a block (C), u32
    16      8     slot_count (N), u64
    24      8     block_size, u64
    32      8     chunk_size, u64
    40      8     the slab file's inode number, u64
    48      8     the slab file's size, u64
    56      8     the slab file's modification time, u64 nanoseconds
    64      8     next generation of the slab's write counter, u64
    72      8     blocks in the index, u64
    80      8     bytes of those blocks, u64
    88      8     free slots (F), u64
    96      48    S3-FIFO queues: tail, head, length of small, then of main,
                  i64 each
    144     16    the index's identity key (``sidecar.cache.index``, "Identity
                  hash"): the identity hashes below are keyed with it
    160     8     xxh3_64 (seed 0) of the body
    168     8     xxh3_64 (seed 0) of bytes 0..167
    176     body, the arrays in this order (T = N + N // 4 + 1):
            4*N   identity hash tags (bytes 0..3 of each)
            8*N   identity hashes (bytes 4..11 of each)
            4*N   lengths, u32 (0xFFFFFFFF: no block)
            4*N   generations, u32 (low 32 bits)
            8*C*N chunk checksums, u64
            4*T   hash table, i32 slot numbers (-1: empty)
            4*N   FIFO prev links, i32
            4*N   FIFO next links, i32
            N     FIFO states, u8
            4*F   free slots, i32, a stack (the last is used first)

A snapshot describes the slab only as it was when it was written, so it must
never outlive the next write to the slab. The protocol makes sure of it:

- ``save`` runs at a clean stop, after the last read and write of the store
  finished and before the slab is closed, and only if the start's scan of
  the slot headers (after a crash) was done: an index that lacks the slots
  not scanned yet would lose their blocks. Then ``index.snap.tmp`` is written,
  fsynced and renamed over ``index.snap``, then the directory is fsynced.
  Slots the snapshot calls free may still see late writes (a fetch's chunk
  landing into a slot it had reserved); those are free slots, rewritten
  from step 1 before they hold a block again. No slot the snapshot calls
  live is written after it.
- ``take`` at start reads the file and **deletes it** (and fsyncs the
  directory) before the store exists, so before any write to the slab: a
  crash later leaves no snapshot, and the start after it scans the headers.
  If the file cannot be deleted it is not used.
- It is used only if both checksums match, every slot number and count in it
  lies inside the slab (a file with the right checksums may still come from
  another writer), the geometry is the slab's, and
  the slab file is the same file (inode) of the same size and modification
  time (``save`` takes them from the file the store has open, not from the
  path, which may name a file put there since), kept whole (``Opening.state``
  "reused"); anything else is a scan, with a log line. The time catches a
  slab written after the snapshot by other means (an older version of the
  sidecar that knows no snapshots, say), unless within the file system's
  timestamp granularity.

Version 1 (before the identity key) held unkeyed identity hashes: it is "of
another format", and the start scans the slot headers, whose names are hashed
anew with a new key. The slab file itself did not change.

Even a stale snapshot could not serve wrong bytes: every read verifies the
chunks it serves against the checksums in the index, which were taken from
the block's own data; a slot rewritten since would fail them (a miss).
"""

from __future__ import annotations

import logging
import os
import struct
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from io import BufferedReader
from pathlib import Path

import xxhash

from sidecar.cache.index import HASH_BYTES, IDENTITY_KEY_BYTES, NO_BLOCK, SlotIndex
from sidecar.cache.slot_fifo import MAX_STATE, SlotFifo

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")

SNAPSHOT_FILE_NAME = "index.snap"
MAGIC = b"KCINDEX1"
VERSION = 2
_HEAD = struct.Struct(f"<8sHHIQQQQQQQQQQqqqqqq{IDENTITY_KEY_BYTES}sQ")
_HEAD_SIZE = _HEAD.size + 8
assert _HEAD.size == 168


@dataclass(frozen=True)
class Restored:
    """What a snapshot held: the index, the policy and the free stack."""

    index: SlotIndex
    policy: SlotFifo
    free: array[int]
    next_generation: int


@dataclass(frozen=True)
class Taken:
    """The outcome of ``take``: the snapshot, or why there was none to use."""

    restored: Restored | None
    reason: str | None  # why not (None: there was no snapshot, or it was used)


def save(directory: Path, slab_path: Path, index: SlotIndex, policy: SlotFifo,
         free: array[int], next_generation: int,
         slab_stat: os.stat_result | None = None) -> int:
    """Write the snapshot (see the module docstring); its size in bytes. Blocking.

    ``slab_stat``: the slab file as the store has it open (``Slab.stat``), by
    default ``slab_path``'s. They differ when the file at the path was replaced
    under the store: the snapshot must describe the file the index is of, so
    that the next start refuses it for the file now at the path."""
    stat = os.stat(slab_path) if slab_stat is None else slab_stat
    parts: list[array[int] | bytearray] = [*index.buffers(), *policy.buffers(), free]
    body = xxhash.xxh3_64()
    for part in parts:
        body.update(memoryview(part).cast("B"))
    fields = _HEAD.pack(
        MAGIC, VERSION, HASH_BYTES, index.chunks_per_block, index.slot_count,
        index.block_size, index.chunk_size, stat.st_ino, stat.st_size, stat.st_mtime_ns,
        next_generation,
        len(index), index.used_bytes, len(free), *policy.queues(), index.identity_key,
        body.intdigest())
    head = fields + struct.pack("<Q", xxhash.xxh3_64_intdigest(fields))
    path = directory / SNAPSHOT_FILE_NAME
    partial = path.with_name(SNAPSHOT_FILE_NAME + ".tmp")
    try:
        with open(partial, "wb") as file:
            file.write(head)
            for part in parts:
                file.write(memoryview(part).cast("B"))
            file.flush()
            os.fsync(file.fileno())
            size = file.tell()
        os.replace(partial, path)
    except OSError:
        partial.unlink(missing_ok=True)  # a full disk must not keep half a snapshot
        raise
    _sync_directory(directory)
    return size


def save_at_close(slab_path: Path, slab_stat: Callable[[], os.stat_result], index: SlotIndex,
                  policy: SlotFifo, free: array[int], next_generation: int) -> None:
    """``save`` beside the slab, when the store closes: no read or write of a
    live slot is under way any more. ``slab_stat``: the open slab file's
    (``Slab.stat``). Blocking. A snapshot that cannot be saved is logged: the
    next start scans the slot headers instead."""
    started = time.perf_counter()
    try:
        size = save(slab_path.parent, slab_path, index, policy, every_free_slot(index, free),
                    next_generation, slab_stat())
    except OSError as exc:
        log.warning("could not save the cache index snapshot: %s", exc)
        return
    log.info("cache index snapshot saved: %d blocks, %d bytes, in %.3f s",
             len(index), size, time.perf_counter() - started)


def every_free_slot(index: SlotIndex, free: array[int]) -> array[int]:
    """The free stack to save: ``free``, under it every other slot that holds no
    block. At a clean stop some slots are neither live nor on the free stack:
    dropped while a reader pinned them, having their valid flag cleared, given
    back to the disk (shrink), or reserved by a write that ended after the stop
    began. The store frees none of them once closed, and a snapshot that left
    them out would keep them out of use at every start that takes it over (a
    scan frees every slot without a block). Blocking: a pass over the slots."""
    if len(free) + len(index) == index.slot_count:
        return free  # every slot is free or live: the usual stop, no pass needed
    # A byte a slot, not a set of ints: a few MiB for millions of free slots.
    listed = bytearray(index.slot_count)
    for slot in free:
        listed[slot] = 1
    lengths = index.lengths
    # Highest first: the stack hands out the lowest of them first, once the
    # slots that were free already are used.
    missing = array("i", (slot for slot in range(index.slot_count - 1, -1, -1)
                          if lengths[slot] == NO_BLOCK and not listed[slot]))
    return missing + free if missing else free


def take(directory: Path, slab_path: Path, slot_count: int, block_size: int,
         chunk_size: int, *, usable: bool = True) -> Taken:
    """The snapshot in ``directory`` if it describes this slab, deleted from the
    disk before this returns either way. ``usable`` False: the slab was not
    kept whole (resized, truncated, recreated), only delete it. Blocking."""
    path = directory / SNAPSHOT_FILE_NAME
    try:
        path.with_name(SNAPSHOT_FILE_NAME + ".tmp").unlink(missing_ok=True)
        file = open(path, "rb")  # noqa: SIM115 - closed below, before the unlink
    except FileNotFoundError:
        return Taken(None, None)
    except OSError as exc:
        return Taken(None, f"index snapshot not used: {exc}")
    try:
        with file:
            restored, reason = (
                _read(file, slab_path, slot_count, block_size, chunk_size) if usable else
                (None, "index snapshot not used: the slab file was not kept whole"))
        path.unlink()
        _sync_directory(directory)
    except OSError as exc:
        return Taken(None, f"index snapshot not used: {exc}")
    return Taken(restored, reason)


def _read(file: BufferedReader, slab_path: Path, slot_count: int, block_size: int,
          chunk_size: int) -> tuple[Restored | None, str | None]:
    head = file.read(_HEAD_SIZE)
    if len(head) >= 10 and head[:8] == MAGIC and struct.unpack_from("<H", head, 8)[0] != VERSION:
        # Version 1 (unkeyed identity hashes) is this, not damage.
        return None, "index snapshot of another format: scanning the slots"
    if len(head) != _HEAD_SIZE:
        return None, (f"index snapshot damaged (cut short: {len(head)} bytes, its header "
                      f"alone is {_HEAD_SIZE}): scanning the slots")
    if xxhash.xxh3_64_intdigest(head[:_HEAD.size]) != struct.unpack_from("<Q", head, _HEAD.size)[0]:
        return None, "index snapshot damaged (its header checksum): scanning the slots"
    (magic, version, hash_bytes, _chunks, slots, saved_block_size, saved_chunk_size, inode,
     size, mtime, next_generation, count, used_bytes, free_count, *queues, identity_key,
     body_digest) = _HEAD.unpack(head[:_HEAD.size])
    if magic != MAGIC or version != VERSION or hash_bytes != HASH_BYTES:
        return None, "index snapshot of another format: scanning the slots"
    stat = os.stat(slab_path)
    if (slots, saved_block_size, saved_chunk_size) != (slot_count, block_size, chunk_size) or \
            (inode, size, mtime) != (stat.st_ino, stat.st_size, stat.st_mtime_ns) or \
            free_count > slot_count:
        return None, "index snapshot of another slab file or geometry: scanning the slots"
    index = SlotIndex(slot_count, block_size, chunk_size, identity_key)
    policy = SlotFifo(slot_count, index.fingerprint_of)
    free = array("i", [0]) * free_count
    body = xxhash.xxh3_64()
    for part in [*index.buffers(), *policy.buffers(), free]:
        view = memoryview(part).cast("B")
        if file.readinto(view) != len(view):
            return None, "index snapshot cut short: scanning the slots"
        body.update(view)
    if file.read(1) or body.intdigest() != body_digest:
        return None, "index snapshot damaged (its body checksum): scanning the slots"
    wrong = _out_of_range(index, policy, free, tuple(queues), count, used_bytes)
    if wrong is not None:
        return None, f"index snapshot damaged ({wrong} out of range): scanning the slots"
    index.restored(count, used_bytes)
    policy.restored(tuple(queues))
    return Restored(index, policy, free, next_generation), None


def _out_of_range(index: SlotIndex, policy: SlotFifo, free: array[int],
                  queues: tuple[int, ...], count: int, used_bytes: int) -> str | None:
    """The first slot number, block length or count of a snapshot that lies
    outside the slab, or None. The checksums prove the file is what some writer wrote, not that
    the writer was this code: a slot number past the arrays would raise an
    IndexError mid-request, or, negative, index from their end. min() and
    max() over the arrays run in C: milliseconds for a million slots."""
    slots = index.slot_count
    table = index.buffers()[5]  # i32 slot numbers, -1 empty
    prev, following, states = policy.buffers()
    for name, numbers, lowest in (("a hash table slot", table, -1), ("a FIFO link", prev, -1),
                                  ("a FIFO link", following, -1), ("a free slot", free, 0)):
        if numbers and (min(numbers) < lowest or max(numbers) >= slots):
            return name
    if states and max(states) > MAX_STATE:
        return "a FIFO state"
    # A block longer than a slot would be read past its slot's end (the reads'
    # checksums would refuse its bytes, but each read would fail).
    held = list(filter(NO_BLOCK.__ne__, index.lengths))
    if held and (min(held) < 1 or max(held) > index.block_size):
        return "a block length"
    for at in (0, 3):  # (tail, head, length) of small, then of main
        tail, head, length = queues[at:at + 3]
        if not (-1 <= tail < slots and -1 <= head < slots and 0 <= length <= slots):
            return "a FIFO queue"
    if not 0 <= count <= slots or not 0 <= used_bytes <= slots * index.block_size:
        return "the block count"
    return None


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
