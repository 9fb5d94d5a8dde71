"""Which segments a replay's offset or time range touches."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spark_warmup.plan import Replay, Span
from spark_warmup.selection import Segment, needs_timestamps, overlapping, select_segments


def segments(starts: list[int], times: list[int | None] | None = None) -> list[Segment]:
    times = times or [None] * len(starts)
    return [Segment("t", 0, f"t-id/0/{start:020d}-x.log", 100, start, base)
            for start, base in zip(starts, times, strict=True)]


def replay(offsets: Span | None = None, times: Span | None = None,
           partitions: tuple[int, ...] | None = None) -> Replay:
    return Replay("replays[0]", "t", partitions, offsets, times)


def test_the_segments_holding_the_range_are_chosen() -> None:
    starts = [0, 100, 200, 300]
    assert overlapping(starts, Span(150, 250)) == [1, 2]
    assert overlapping(starts, Span(100, 199)) == [1]  # exactly one segment
    assert overlapping(starts, Span(99, 100)) == [0, 1]  # straddles a boundary
    assert overlapping(starts, Span(0, 0)) == [0]
    assert overlapping(starts, Span(350, 400)) == [3]  # the last segment is open-ended
    assert overlapping(starts, Span(10_000, None)) == [3]
    assert overlapping(starts, Span(0, None)) == [0, 1, 2, 3]
    assert overlapping([50, 100], Span(0, 10)) == []  # before the first remote segment
    assert overlapping([], Span(0, None)) == []


def test_unknown_starts_are_kept() -> None:
    # A header that could not be read: the segment before it cannot be shown to end
    # before the range, so it stays in; the unknown one goes only when its successor
    # shows it ended before the range.
    assert overlapping([0, None, 200, 300], Span(250, 260)) == [0, 2]
    assert overlapping([0, None, 200, 300], Span(10, 20)) == [0, 1]


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=12, unique=True),
       st.integers(0, 1100), st.integers(0, 200))
def test_offsets_match_interval_intersection(starts: list[int], first: int, length: int) -> None:
    starts.sort()
    last = first + length
    expected = []
    for i, start in enumerate(starts):
        end = starts[i + 1] - 1 if i + 1 < len(starts) else float("inf")
        if start <= last and end >= first:
            expected.append(i)
    assert overlapping(starts, Span(first, last)) == expected


def test_select_by_offsets_in_any_listing_order() -> None:
    listed = segments([200, 0, 300, 100])
    chosen = select_segments(listed, replay(offsets=Span(150, 250)))
    assert [s.start_offset for s in chosen] == [100, 200]


def test_select_by_time_uses_the_first_batch_timestamps() -> None:
    listed = segments([0, 100, 200, 300], times=[1000, 2000, 3000, 4000])
    assert [s.start_offset for s in select_segments(listed, replay(times=Span(2500, 3500)))] \
        == [100, 200]
    assert [s.start_offset for s in select_segments(listed, replay(times=Span(4500, None)))] \
        == [300]
    assert select_segments(listed, replay(times=Span(0, 999))) == []


def test_no_range_means_the_whole_partition() -> None:
    listed = segments([0, 100])
    assert select_segments(listed, replay()) == sorted(listed, key=lambda s: s.start_offset)


def test_headers_are_read_only_for_partitions_selected_by_time() -> None:
    replays = [Replay("replays[0]", "a", (0,), Span(0, 5), None),
               Replay("replays[1]", "b", (1,), None, Span(0, 5)),
               Replay("replays[2]", "c", None, None, Span(0, 5))]
    assert not needs_timestamps(replays, "a", 0)
    assert needs_timestamps(replays, "b", 1) and not needs_timestamps(replays, "b", 0)
    assert needs_timestamps(replays, "c", 7)


def test_every_copy_of_a_segment_is_selected_with_it() -> None:
    # Two objects start at offset 100: a copy a new leader uploaded again under a
    # new segment id, the first upload left behind. Which one the brokers read
    # is in their remote log metadata, not in the bucket: both are warmed.
    listed = [Segment("t", 0, f"t-id/0/{start:020d}-{copy}.log", 100, start, base)
              for start, copy, base in ((0, "a", 1000), (100, "b", 2000), (100, "c", None),
                                        (200, "d", 3000))]
    for chosen in (select_segments(listed, replay(offsets=Span(150, 160))),
                   select_segments(listed, replay(times=Span(2500, 2600))),
                   select_segments(list(reversed(listed)), replay(offsets=Span(150, 160)))):
        assert [s.key[-5:] for s in chosen] == ["b.log", "c.log"]
    assert [s.key[-5:] for s in select_segments(listed, replay(offsets=Span(50, 150)))] \
        == ["a.log", "b.log", "c.log"]
    assert [s.key[-5:] for s in select_segments(listed, replay(offsets=Span(200, None)))] \
        == ["d.log"]
