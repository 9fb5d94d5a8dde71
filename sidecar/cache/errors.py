"""Errors of the block cache.

They stay inside the cache package's contract: the store turns a checksum
mismatch into a miss and a full cache into "not cached", so neither reaches the
HTTP layer.
"""

from __future__ import annotations


class CacheFullError(Exception):
    """Every resident entry is pinned: nothing can be evicted to make room."""


class ChecksumMismatch(Exception):
    """Cached bytes no longer match the checksum recorded when they were written."""

    def __init__(self, slot: int, chunk: int) -> None:
        super().__init__(f"slot {slot}: chunk {chunk} does not match its checksum")
        self.slot = slot
        self.chunk = chunk


class CacheDiskError(OSError):
    """The cache disk refused a read or a write (ENOSPC, EIO): the block is not
    cached; the sidecar bypasses the cache until the disk is well again."""
