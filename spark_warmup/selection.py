"""Which segments of a partition a replay's range touches.

A partition's segments, in offset order, each cover the offsets from their own
start offset (the 20 digits in the key) up to the next segment's start; the
last one is open-ended. So segment i overlaps the inclusive range [first, last]
when its start <= last and the next segment's start > first.

Time ranges use the same rule with each segment's first record batch's
baseTimestamp in place of the start offset. Kafka timestamps need not grow
monotonically, so this is the planning rule, not a guarantee: a segment whose
first header could not be read counts as overlapping (warming too much is
cheaper than a replay that misses).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sidecar.layout import segments_in_range
from spark_warmup.plan import Replay, Span


@dataclass(frozen=True)
class Segment:
    """One remote `.log` object of a partition, as listed (and, for time ranges, peeked at)."""

    topic: str
    partition: int
    key: str
    size: int
    start_offset: int
    base_timestamp: int | None = None  # first batch's baseTimestamp (ms), if read
    max_timestamp: int | None = None  # first batch's maxTimestamp (ms), if read
    # The segment's `.rsm-manifest` and `.indexes` found beside it, (key, size): the
    # broker's first read of a segment fetches them before any of its log, so they are
    # warmed with it.
    companions: tuple[tuple[str, int], ...] = ()

    @property
    def warm_bytes(self) -> int:
        """The bytes a warm-up of the segment fetches: its log and its companions."""
        return self.size + sum(size for _, size in self.companions)


def overlapping(starts: Sequence[int | None], span: Span) -> list[int]:
    """Indices of the ordered pieces, starting at `starts`, that overlap `span`
    (the rule `sidecar replay` selects by too: sidecar.layout.segments_in_range)."""
    return segments_in_range(starts, span.first, span.last)


def select_segments(segments: Sequence[Segment], replay: Replay) -> list[Segment]:
    """The segments of one partition (in any order) that the replay reads.

    Objects that start at the same offset are copies of one segment: a leader
    that took over while the last one uploaded it uploads it again under a new
    segment id, and the first copy stays in the bucket until it is cleaned up.
    Which copy the brokers read is in their remote log metadata, not in the
    bucket, so all of them are selected together (taken one by one, each would
    seem to end where the next copy starts, and only the last would be warmed).
    """
    copies: list[list[Segment]] = []
    for segment in sorted(segments, key=lambda s: (s.start_offset, s.key)):
        if copies and copies[-1][0].start_offset == segment.start_offset:
            copies[-1].append(segment)
        else:
            copies.append([segment])
    if replay.offsets is not None:
        indices = overlapping([same[0].start_offset for same in copies], replay.offsets)
    elif replay.times_ms is not None:
        indices = overlapping([_first_time(same) for same in copies], replay.times_ms)
    else:
        indices = list(range(len(copies)))
    return [segment for i in indices for segment in copies[i]]


def _first_time(copies: Sequence[Segment]) -> int | None:
    """The first batch's time of a segment's copies (they hold the same
    records); None when no copy's header could be read."""
    known = [s.base_timestamp for s in copies if s.base_timestamp is not None]
    return min(known) if known else None


def needs_timestamps(replays: Iterable[Replay], topic: str, partition: int) -> bool:
    """Whether any replay selects this partition by time (so its headers must be read)."""
    return any(
        r.times_ms is not None and r.topic == topic
        and (r.partitions is None or partition in r.partitions)
        for r in replays
    )
