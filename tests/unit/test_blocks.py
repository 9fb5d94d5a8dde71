from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.blocks import block_count, block_span, blocks_for_range, coalesce_runs


@pytest.mark.parametrize(
    ("size", "block_size", "expected"),
    [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (8, 4, 2), (9, 4, 3), (7, 1, 7)],
)
def test_block_count(size: int, block_size: int, expected: int) -> None:
    assert block_count(size, block_size) == expected


def test_blocks_for_range() -> None:
    assert blocks_for_range(0, 0, 4) == range(0, 1)
    assert blocks_for_range(0, 3, 4) == range(0, 1)
    assert blocks_for_range(3, 4, 4) == range(0, 2)
    assert blocks_for_range(4, 11, 4) == range(1, 3)
    assert blocks_for_range(5, 12, 4) == range(1, 4)


def test_block_span() -> None:
    assert block_span(0, 4, 10) == (0, 4)
    assert block_span(1, 4, 10) == (4, 8)
    assert block_span(2, 4, 10) == (8, 10)  # last block shorter
    assert block_span(1, 4, 8) == (4, 8)  # exact multiple: last block full


@pytest.mark.parametrize(
    ("block", "block_size", "size"),
    [(3, 4, 10), (-1, 4, 10), (0, 4, 0), (2, 4, 8), (0, 0, 10), (0, 4, -1)],
)
def test_block_span_out_of_range(block: int, block_size: int, size: int) -> None:
    with pytest.raises(ValueError):
        block_span(block, block_size, size)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        block_count(10, 0)
    with pytest.raises(ValueError):
        block_count(-1, 4)
    with pytest.raises(ValueError):
        blocks_for_range(5, 4, 4)
    with pytest.raises(ValueError):
        blocks_for_range(-1, 4, 4)
    with pytest.raises(ValueError):
        blocks_for_range(0, 4, -4)
    with pytest.raises(ValueError):
        coalesce_runs([1, 2], 0)
    with pytest.raises(ValueError):
        coalesce_runs([3, -1], 4)


@pytest.mark.parametrize(
    ("blocks", "max_run", "expected"),
    [
        ([], 4, []),
        ([5], 4, [(5, 5)]),
        ([3, 1, 2, 2, 1], 4, [(1, 3)]),
        ([0, 1, 2, 5, 6, 9], 8, [(0, 2), (5, 6), (9, 9)]),
        (range(10), 4, [(0, 3), (4, 7), (8, 9)]),
        (range(8), 4, [(0, 3), (4, 7)]),
        ([0, 1, 2], 1, [(0, 0), (1, 1), (2, 2)]),
        (iter([7, 6, 5]), 2, [(5, 6), (7, 7)]),
    ],
)
def test_coalesce_runs(
    blocks: list[int], max_run: int, expected: list[tuple[int, int]]
) -> None:
    assert coalesce_runs(blocks, max_run) == expected


# --- properties ----------------------------------------------------------


@given(
    st.lists(st.integers(min_value=0, max_value=200), max_size=80),
    st.integers(min_value=1, max_value=12),
)
def test_coalesce_runs_properties(blocks: list[int], max_run: int) -> None:
    runs = coalesce_runs(blocks, max_run)
    covered = [b for first, last in runs for b in range(first, last + 1)]
    assert covered == sorted(set(blocks))  # exact, ascending, no duplicates
    for first, last in runs:
        assert first <= last
        assert last - first + 1 <= max_run
    for (_, prev_last), (next_first, _) in itertools.pairwise(runs):
        assert prev_last < next_first
    for (p_first, p_last), (n_first, n_last) in itertools.pairwise(runs):
        mergeable = n_first == p_last + 1 and n_last - p_first + 1 <= max_run
        assert not mergeable


@given(
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=0, max_value=3_000),
    st.integers(min_value=1, max_value=600),
)
def test_range_blocks_round_trip(start: int, length: int, block_size: int) -> None:
    end = start + length
    size = end + 1 + length % 7  # object at least as long as the range
    blocks = blocks_for_range(start, end, block_size)
    spans = [block_span(b, block_size, size) for b in blocks]
    hits = [0] * (end - start + 1)
    for lo, hi in spans:
        assert lo < hi
        # Every listed block must contribute at least one byte of the range.
        assert lo <= end and hi > start
        for byte in range(max(lo, start), min(hi, end + 1)):
            hits[byte - start] += 1
    assert hits == [1] * (end - start + 1)


@given(
    st.integers(min_value=0, max_value=5000), st.integers(min_value=1, max_value=300)
)
def test_spans_tile_the_object(size: int, block_size: int) -> None:
    count = block_count(size, block_size)
    spans = [block_span(b, block_size, size) for b in range(count)]
    assert sum(hi - lo for lo, hi in spans) == size
    assert [lo for lo, _ in spans] == list(range(0, size, block_size))
    assert all(hi - lo == block_size for lo, hi in spans[:-1])
    if spans:
        assert 0 < spans[-1][1] - spans[-1][0] <= block_size
        assert blocks_for_range(0, size - 1, block_size) == range(len(spans))
