"""The write lifecycle of a block: a slot reserved, filled, sealed, cached.

A block in hand is written whole (``write``). A block on its way from the
origin gets its slot first (``begin_write``: the slot's valid flag cleared,
step 1 of ``sidecar.cache.slot_format``'s write), its chunks are written as
they arrive, in the fetch's worker thread (``write_chunk``), readers may read
the chunks that landed meanwhile (``SlotReader.read_landed``), and ``commit``
then seals its header and makes it a cached block, or ``abort`` gives the
slot back. A write the disk refuses caches nothing; the caller hears why.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from sidecar.cache.disk_faults import DiskFaults
from sidecar.cache.disk_work import DiskWork
from sidecar.cache.errors import CacheDiskError
from sidecar.cache.ident import BlockIdent
from sidecar.cache.outcomes import Written
from sidecar.cache.residency import Residency
from sidecar.cache.slab import Slab

# The store's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.store")


@dataclass(eq=False)
class BlockWrite:
    """A slot reserved for a block whose bytes are on their way (a fetch in flight).

    Chunks are written into the slot as they arrive (``write_chunk``, in the
    fetch's worker thread) and can be read from it at once (``read_landed``);
    ``commit`` then makes it a cached block, ``abort`` gives the slot back.
    ``evicted``: what reserving the slot pushed out of the cache.
    """

    ident: BlockIdent
    slot: int
    length: int
    generation: int
    chunk_size: int
    evicted: tuple[BlockIdent, ...]
    checksums: list[int | None]
    # Set (in a worker thread) when a chunk went through the page cache (a
    # short last chunk): ``commit`` has those pages written back and dropped.
    buffered: bool = False

    @property
    def complete(self) -> bool:
        return None not in self.checksums

    def check_landed(self, start: int, end: int) -> None:
        """Raise ValueError unless every chunk of bytes [start, end) has landed."""
        first, last = start // self.chunk_size, (end - 1) // self.chunk_size
        if not 0 <= start < end <= self.length or \
                any(self.checksums[c] is None for c in range(first, last + 1)):
            raise ValueError(f"bytes {start}..{end} of {self.ident} have not all landed")


class BlockWriter:
    def __init__(self, *, residency: Residency, slab: Slab, work: DiskWork,
                 faults: DiskFaults, next_generation: int) -> None:
        self._residency = residency
        self._slots = residency.slots
        self._slab = slab
        self._work = work
        self._faults = faults
        # The last generation given out: a start that scans gives out those of
        # a new epoch, above every one on disk (slot_format.py, "Generations");
        # one from the snapshot resumes its counter.
        self._generation = next_generation - 1

    @property
    def next_generation(self) -> int:
        """The generation the next write gets (saved with the index snapshot)."""
        return self._generation + 1

    async def write(
        self, ident: BlockIdent, data: bytes | bytearray, *, read: bool = True
    ) -> Written:
        """Cache ``data`` as ``ident`` (replacing any previous copy).

        ``read`` False: no reader has had the bytes yet (the block was fetched
        ahead of them), so its first lookup is its first use, not a hit.
        """
        if len(data) > self._slab.block_size:
            raise ValueError(f"{len(data)} bytes do not fit a block of {self._slab.block_size}")
        if self._slots.closed:
            return Written(None)
        slot, evicted = await self._residency.reserve_slot()
        if slot is None or self._slots.closed:
            if slot is not None:
                self._slots.free.append(slot)
            return Written(None)
        self._slots.writing[slot] = ident
        self._residency.paged_out.discard(slot)
        self._generation += 1
        written = await self._work.shielded(
            self._write_reserved(slot, ident, self._generation, data, read)
        )
        if evicted is None:
            return written
        return Written(written.record, (evicted, *written.evicted), written.disk_error)

    async def _write_reserved(
        self, slot: int, ident: BlockIdent, generation: int, data: bytes | bytearray,
        read: bool,
    ) -> Written:
        try:
            record = await self._work.run(self._slab.write_block, slot, ident, generation, data)
        except BaseException as exc:
            # The next write of this slot clears its valid flag first, so a
            # half-written slot needs no cleanup on disk.
            self._slots.end_write(slot)
            self._slots.retire(slot, clear_on_disk=False)
            if isinstance(exc, OSError):
                # A failing cache disk must not fail the client whose block
                # this is: the block is just not cached.
                log.warning("could not cache block %s in slot %d: %s", ident, slot, exc)
                return Written(None, disk_error=self._faults.write_failed(exc))
            raise
        return self._residency.admit(slot, ident, record, read)

    async def begin_write(
        self, ident: BlockIdent, length: int, *, may_wait: bool = True
    ) -> BlockWrite | None:
        """Reserve a slot for a block of `length` bytes about to arrive, its valid
        flag cleared (step 1 of a write); None when no slot can be had (every
        slot pinned or being written) or the store is closed.

        ``may_wait``: the caller holds no other reserved slot, so it may wait for
        a block on its way into probation to make room (see reserve_slot); a
        fetch reserving the second block of a run must not, or it would wait
        for its own first block, which lands only once all are reserved."""
        if not 0 <= length <= self._slab.block_size:
            raise ValueError(f"{length} bytes do not fit a block of {self._slab.block_size}")
        if self._slots.closed:
            return None
        slot, evicted = await self._residency.reserve_slot(may_wait)
        if slot is None or self._slots.closed:
            if slot is not None:
                self._slots.free.append(slot)
            return None
        self._slots.writing[slot] = ident
        if self._slab.direct_io:
            # Its chunks go past the page cache: a read of the block goes to
            # the disk at once, with no try on the loop first.
            self._residency.paged_out.add(slot)
        else:
            self._residency.paged_out.discard(slot)
        self._generation += 1
        chunk = self._slab.chunk_size
        write = BlockWrite(ident, slot, length, self._generation, chunk,
                           () if evicted is None else (evicted,),
                           [None] * -(-length // chunk))
        try:
            await self._work.shielded(self._work.run(self._slab.invalidate, slot))
        except OSError as exc:
            self.abort(write)
            raise CacheDiskError(self._faults.write_failed(exc)) from exc
        return write

    def write_chunk(self, write: BlockWrite, offset: int, data: memoryview) -> int:
        """Write one chunk of `write` at `offset` of its data; its checksum.
        Blocking, thread safe: called in the fetch's worker thread (the slot is
        the write's alone). Raises CacheDiskError when the disk refuses it."""
        try:
            written = self._slab.write_chunk(write.slot, offset, data, first=False)
        except OSError as exc:
            raise CacheDiskError(self._faults.write_failed(exc)) from exc
        if not written.direct:
            write.buffered = True
        return written.checksum

    async def commit(self, write: BlockWrite, *, read: bool) -> Written:
        """Seal a complete write (its header, step 3) and cache it. ``read``: as in
        ``write``. A write invalidated meanwhile is dropped, not cached."""
        if not write.complete:
            raise ValueError(f"block {write.ident} is not complete")
        checksums = tuple(c for c in write.checksums if c is not None)
        try:
            record = await self._work.shielded(self._work.run(
                self._slab.seal, write.slot, write.ident, write.generation, write.length,
                checksums))
        except OSError as exc:
            log.warning("could not cache block %s in slot %d: %s", write.ident, write.slot, exc)
            self.abort(write)
            return Written(None, write.evicted, self._faults.write_failed(exc))
        if write.buffered and write.slot in self._residency.paged_out:
            # Read past the page cache from now on, so the pages of its short
            # last chunk serve no one there: written back and dropped now
            # (a reader going past the block finds nothing to do).
            self._residency.write_back(write.slot)
        written = self._residency.admit(write.slot, write.ident, record, read)
        return Written(written.record, (*write.evicted, *written.evicted), written.disk_error)

    def abort(self, write: BlockWrite) -> None:
        """Give an unfinished write's slot back (once its readers have let go)."""
        if self._slots.writing.get(write.slot) == write.ident:
            self._slots.end_write(write.slot)
            # The flag was cleared first: whatever landed is no block for recovery.
            self._slots.retire(write.slot, clear_on_disk=False)
