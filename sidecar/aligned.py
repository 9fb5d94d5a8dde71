"""Page-aligned memory: what O_DIRECT asks of a buffer (open(2), "O_DIRECT":
the buffer's address, the length and the file offset aligned to the file
system's logical block size, at most a page on the devices a cache lives on).
"""

from __future__ import annotations

import ctypes

PAGE_SIZE = 4096


def page_aligned(data: memoryview) -> bool:
    """Whether ``data`` starts on a page boundary. Only writable, contiguous
    views can tell their address here; any other counts as not aligned."""
    if data.readonly or not data.c_contiguous or not len(data):
        return False
    return ctypes.addressof(ctypes.c_char.from_buffer(data)) % PAGE_SIZE == 0


def page_offset(raw: bytearray) -> int:
    """How far into ``raw`` its first page boundary lies."""
    return -ctypes.addressof(ctypes.c_char.from_buffer(raw)) % PAGE_SIZE


def page_aligned_buffer(size: int) -> memoryview:
    """``size`` writable bytes (zeros) starting on a page boundary."""
    raw = bytearray(size + PAGE_SIZE)
    skip = page_offset(raw)
    return memoryview(raw)[skip:skip + size]
