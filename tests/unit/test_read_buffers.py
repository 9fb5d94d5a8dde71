"""The slab's read buffers: page-aligned, handed out again only once nothing
refers to them, and never more kept than the limit."""

from __future__ import annotations

import pytest

from sidecar.aligned import page_aligned
from sidecar.cache.read_buffers import ReadBuffers

SIZE = 64 * 1024


def test_a_buffer_comes_back_once_its_last_view_is_gone() -> None:
    pool = ReadBuffers(limit=2, size=SIZE)
    first = pool.take(SIZE)
    assert page_aligned(first) and len(first) == SIZE
    kept_slice = first[10:20]  # a piece still being served
    first_owner = id(first.obj)  # not the object: a reference would keep it in use
    del first
    second = pool.take(100)
    assert id(second.obj) != first_owner and pool.kept == 2
    del kept_slice
    third = pool.take(4096)
    assert id(third.obj) == first_owner and len(third) == 4096 and page_aligned(third)


def test_past_the_limit_buffers_are_made_afresh_and_not_kept() -> None:
    pool = ReadBuffers(limit=1, size=SIZE)
    held = pool.take(SIZE)
    extra = pool.take(SIZE)
    assert extra.obj is not held.obj and page_aligned(extra)
    assert pool.kept == 1
    del held
    assert pool.kept == 1 and pool.take(SIZE).obj is not extra.obj


def test_a_request_larger_than_the_buffers_is_refused() -> None:
    with pytest.raises(ValueError):
        ReadBuffers(limit=1, size=SIZE).take(SIZE + 1)
    with pytest.raises(ValueError):
        ReadBuffers(limit=1, size=SIZE).take(0)
