"""Page-aligned buffers for the slab's reads past the page cache, reused.

A chunk read with O_DIRECT lands in a page-aligned buffer of its own, which
is then served and kept in the recent-chunk memory. A fresh 1 MiB buffer per
read costs a page fault per 4 KiB once the allocator has handed the memory
back; reusing them cuts the faults and the CPU a GiB costs (bench/ANALYSIS.md
has the figures).

The pool keeps at most `limit` buffers and hands one out again once nothing
refers to it any more: no view of it is being served, and the recent-chunk
memory has let it go. Its reference count says so (every view of a
bytearray holds one reference to it, through the buffer it exports). Past
the limit a buffer is made afresh and freed with its last view, so the
pool bounds what it keeps, never what is in use.
"""

from __future__ import annotations

import sys
import threading

from sidecar.aligned import PAGE_SIZE, page_aligned_buffer, page_offset

# References to a pooled buffer nobody uses: the pool's list entry, the local
# name in `take`, and getrefcount's own argument.
_UNUSED = 3


class ReadBuffers:
    """Up to `limit` page-aligned buffers of `size` bytes; thread safe."""

    def __init__(self, limit: int, size: int) -> None:
        self._limit = limit
        self._size = size
        self._kept: list[tuple[bytearray, int]] = []  # buffer, offset of its page
        self._next = 0
        self._lock = threading.Lock()

    def take(self, length: int) -> memoryview:
        """`length` (at most `size`) writable bytes starting on a page boundary,
        which nothing else refers to."""
        if not 0 < length <= self._size:
            raise ValueError(f"{length} bytes from buffers of {self._size}")
        with self._lock:
            count = len(self._kept)
            for step in range(count):
                raw, skip = self._kept[(self._next + step) % count]
                if sys.getrefcount(raw) <= _UNUSED:
                    self._next = (self._next + step + 1) % count
                    return memoryview(raw)[skip:skip + length]
            if count < self._limit:
                raw = bytearray(self._size + PAGE_SIZE)
                skip = page_offset(raw)
                self._kept.append((raw, skip))
                return memoryview(raw)[skip:skip + length]
        return page_aligned_buffer(length)

    @property
    def kept(self) -> int:
        return len(self._kept)
