"""Chunk data past the page cache: the slab file opened again with O_DIRECT.

``Slab`` writes a chunk this way whenever its buffer starts on a page boundary
and its length is a whole number of pages (the offset always is one: slot data
starts on a page, chunks are multiples of 4096 bytes), and reads a run of
chunks into page-aligned buffers of their own (reused once nothing refers to
them, ``sidecar.cache.read_buffers``). Anything else is an ordinary write or
read: a block's short last chunk, a caller's unaligned buffer, a file system
that refuses O_DIRECT at open or at the first call (from then on everything
goes through the page cache).
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from sidecar.aligned import PAGE_SIZE, page_aligned
from sidecar.cache.read_buffers import ReadBuffers
from sidecar.cache.slab_file import pwrite_all

# The slab's log lines keep the logger name they always had.
log = logging.getLogger("sidecar.cache.slab")


class DirectIO:
    """The O_DIRECT descriptor of a slab file (None: refused at open), whether
    it still works, and the page-aligned buffers its reads land in."""

    def __init__(self, path: Path, fd: int | None, read_buffers: int, chunk_size: int) -> None:
        self._path = path
        # Closed only with the slab: other threads may be writing through it.
        self._fd = fd
        self._enabled = fd is not None
        self._chunk_size = chunk_size
        self._buffers = ReadBuffers(read_buffers, chunk_size)

    @property
    def enabled(self) -> bool:
        """Whether chunk data still goes past the page cache."""
        return self._enabled

    def write(self, data: memoryview, at: int) -> bool:
        """Write ``data`` at ``at`` past the page cache if it can be (whole pages
        from a page-aligned buffer); whether it was."""
        fd = self._fd
        if not self._enabled or fd is None or len(data) % PAGE_SIZE or not page_aligned(data):
            return False
        try:
            pwrite_all(fd, data, at)
        except OSError as exc:
            self._refused(exc)
            return False  # the caller writes the same bytes through the page cache
        return True

    def read(self, lengths: list[int], at: int) -> list[memoryview] | None:
        """Chunks of ``lengths`` bytes from ``at`` on, read with O_DIRECT (each
        buffer whole pages; the short last chunk's tail is read and cut off), or
        None where that cannot be done."""
        fd = self._fd
        if not self._enabled or fd is None:
            return None
        buffers = [self._buffers.take(-(-n // PAGE_SIZE) * PAGE_SIZE) for n in lengths]
        try:
            got = os.preadv(fd, buffers, at)
        except OSError as exc:
            self._refused(exc)
            return None
        views = []
        for buffer, n in zip(buffers, lengths, strict=True):
            views.append(buffer[:max(0, min(n, got))])  # short when the file was cut
            got -= len(buffer)
        return views

    def copy_of(self, data: memoryview) -> memoryview:
        """``data`` (a chunk at most) copied into one of the read buffers.
        Thread safe, no I/O."""
        if len(data) > self._chunk_size:
            raise ValueError(f"{len(data)} bytes do not fit a chunk of {self._chunk_size}")
        copy = self._buffers.take(-(-len(data) // PAGE_SIZE) * PAGE_SIZE)[:len(data)]
        copy[:] = data
        return copy

    def close(self) -> None:
        self._enabled = False
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _refused(self, exc: OSError) -> None:
        """A call through the O_DIRECT descriptor failed. EINVAL: the file system
        takes O_DIRECT at open but not this I/O, so everything goes through the
        page cache from now on. Any other error is the disk's, and raised."""
        if exc.errno != errno.EINVAL:
            raise exc
        self._enabled = False
        log.info("cache file %s: O_DIRECT refused (%s); reads and writes go through the "
                 "page cache", self._path, exc.strerror)
