"""A block on its way from the origin: readers take its bytes as they arrive.

Waiting for a whole 8 MiB block before sending its first byte would make every
miss cost the block's full transfer time (about 130 ms at 64 MB/s) on top of
the origin's first-byte latency; a reader of the block's first MiB only needs
that MiB. One buffer per block, preallocated to the block's length, filled in
order; each waiter is woken as bytes land and reads them through memoryviews
(no copies). The buffer is what the cache writes once it is full.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator


class BlockBuffer:
    def __init__(self, length: int) -> None:
        self.data = bytearray(length)
        self.filled = 0
        # Whether a reader has taken bytes of it: if none has by the time the
        # block is cached, its first read from the cache is its first use.
        self.read = False
        self._error: BaseException | None = None
        self._progress = asyncio.Event()

    @property
    def length(self) -> int:
        return len(self.data)

    @property
    def complete(self) -> bool:
        return self.filled == len(self.data)

    def append(self, chunk: bytes | memoryview) -> None:
        end = self.filled + len(chunk)
        if end > len(self.data):
            raise ValueError(f"{end} bytes do not fit a block of {len(self.data)}")
        self.data[self.filled:end] = chunk
        self.filled = end
        self._wake()

    def fail(self, error: BaseException) -> None:
        """No more bytes will come: waiters beyond what arrived get `error`."""
        if self._error is None and not self.complete:
            self._error = error
            self._wake()

    async def pieces(self, start: int, end: int, piece_size: int) -> AsyncIterator[memoryview]:
        """Bytes [start, end) of the block, each piece as soon as it has arrived."""
        position = start
        while position < end:
            while self.filled <= position:
                if self._error is not None:
                    raise self._error
                # A fresh event per wake-up; waiting on the one current now.
                await self._progress.wait()
            upto = min(end, self.filled, position + piece_size)
            self.read = True
            yield memoryview(self.data)[position:upto]
            position = upto

    async def wait_complete(self) -> None:
        while not self.complete:
            if self._error is not None:
                raise self._error
            await self._progress.wait()

    def _wake(self) -> None:
        self._progress.set()
        self._progress = asyncio.Event()
