"""A block on its way from the origin into its cache slot: readers take its
chunks as they land.

Waiting for a whole 8 MiB block before sending its first byte would make every
miss cost the block's full transfer time (about 130 ms at 64 MB/s) on top of
the origin's first-byte latency; a reader of the block's first MiB only needs
that MiB. The fetch writes each chunk (the cache's 1 MiB checksum unit) into
the block's slot as it arrives and says so here; a reader waiting for a chunk
is woken then and reads it from the slot, verified, as it reads cached
blocks, so no block is held in memory waiting for its readers. Only a chunk
that a reader is waiting for as it lands (`awaited`) is copied, from the
buffer its checksum was taken in, into the store's recent-chunk memory: that
reader, the one a miss keeps waiting, is then served with no read of the disk.

Before the first chunk there is a short moment when the block has no slot yet
(the fetch is reserving it): readers already wait here, so a block is fetched
once however many want it. A block that could get no slot, or whose slot's disk
failed, is `unslotted`: its readers read their range from the origin directly.
"""

from __future__ import annotations

import asyncio

from sidecar.cache import BlockIdent, BlockWrite


class Unslotted(Exception):
    """The block has no slot to land in (every slot busy, or the cache disk
    failed): its readers must read their range straight from the origin."""


class InFlightBlock:
    def __init__(self, ident: BlockIdent, length: int, chunk_size: int, lane: str) -> None:
        self.ident = ident
        self.length = length
        self.chunk_size = chunk_size
        self.lane = lane
        self.write: BlockWrite | None = None
        # Whether a reader has taken bytes of it: if none has by the time the
        # block is cached, its first read from the cache is its first use.
        self.read = False
        self.readers = 0
        # Chunks that readers wait for now (read by the fetch's threads too: a
        # chunk landing with a reader waiting is handed over in memory).
        self._waited: dict[int, int] = {}
        self._error: BaseException | None = None
        self._progress = asyncio.Event()

    @property
    def chunks(self) -> int:
        return -(-self.length // self.chunk_size)

    @property
    def complete(self) -> bool:
        return self.write is not None and self.write.complete

    @property
    def failed(self) -> bool:
        return self._error is not None

    def slotted(self, write: BlockWrite) -> None:
        """The fetch has the block's slot: chunks will land in it."""
        self.write = write
        self._wake()

    def landed(self, chunk: int, checksum: int) -> None:
        """A chunk is in the slot (called on the loop by the fetch)."""
        assert self.write is not None
        self.write.checksums[chunk] = checksum
        self._wake()

    def fail(self, error: BaseException) -> None:
        """No more chunks will land: waiters of missing ones get `error`."""
        if self._error is None and not self.complete:
            self._error = error
            self._wake()

    def awaited(self, chunk: int) -> bool:
        """Whether a reader is waiting for `chunk` now (thread safe: a racy
        answer only costs that reader a read of the slot)."""
        return chunk in self._waited

    async def wait_for(self, chunk: int) -> BlockWrite:
        """The write once `chunk` has landed in it; raises the fetch's failure."""
        self._waited[chunk] = self._waited.get(chunk, 0) + 1
        try:
            while True:
                write = self.write
                if write is not None and write.checksums[chunk] is not None:
                    return write
                if self._error is not None:
                    raise self._error
                await self._progress.wait()
        finally:
            left = self._waited.pop(chunk) - 1
            if left:
                self._waited[chunk] = left

    async def wait_complete(self) -> None:
        while not self.complete:
            if self._error is not None:
                raise self._error
            await self._progress.wait()

    def _wake(self) -> None:
        # A fresh event per wake-up: waiters wait on the one current now.
        self._progress.set()
        self._progress = asyncio.Event()
