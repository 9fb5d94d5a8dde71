"""Page-aligned buffers, as O_DIRECT asks of them."""

from __future__ import annotations

import pytest

from sidecar.aligned import PAGE_SIZE, page_aligned, page_aligned_buffer


@pytest.mark.parametrize("size", [1, 4095, PAGE_SIZE, 1024 * 1024, 1024 * 1024 + 7])
def test_a_buffer_starts_on_a_page_boundary_and_holds_zeros(size: int) -> None:
    view = page_aligned_buffer(size)
    assert len(view) == size and not view.readonly
    assert page_aligned(view)
    assert bytes(view) == bytes(size)
    # Its prefixes start where it starts; a slice one byte in does not.
    assert page_aligned(view[:1])
    if size > 1:
        assert not page_aligned(view[1:])


def test_views_that_cannot_tell_their_address_count_as_unaligned() -> None:
    view = page_aligned_buffer(2 * PAGE_SIZE)
    assert not page_aligned(view.toreadonly())
    assert not page_aligned(view[::2])  # not contiguous
    assert not page_aligned(view[:0])
    assert not page_aligned(memoryview(bytes(PAGE_SIZE)))
