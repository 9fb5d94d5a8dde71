"""A consumer group's next reads as offset ranges, and its lag: pure, from `metadata`.

A group that has fallen behind will next read each partition from its
committed offset (the offset of the next record it will consume, as Kafka's
consumers commit it) up to the partition's log end offset, exclusive. The plan
may bound the end (`to_offset`, inclusive, or `to_time`, which the cluster has
already turned into an end offset). Each partition becomes an ordinary offset
replay of the reads before its local log start (where the broker says where
that is), so the segments are then selected as for any other replay; only the
remote ones are listed, so the part of the lag still on the brokers' disks is
never warmed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spark_warmup.metadata import GroupPosition
from spark_warmup.plan import Replay, Span


@dataclass(frozen=True)
class GroupLag:
    """What one group replay found: its lag, and (after selection) what it warms."""

    where: str
    group: str
    topic: str
    lag_records: int = 0
    behind: tuple[int, ...] = ()  # partitions with records to read
    caught_up: tuple[int, ...] = ()
    uncommitted: tuple[int, ...] = ()  # partitions the group committed nothing for
    segments: int = 0
    bytes: int = 0
    # partition -> the inclusive offset range it will read next
    ranges: Mapping[int, Span] = field(default_factory=dict)


def next_reads(position: GroupPosition, to_offset: int | None) -> Span | None:
    """The inclusive offsets the group reads next in one partition; None if nothing."""
    if position.committed is None:
        return None
    last = position.end - 1
    if position.stop is not None:
        last = min(last, position.stop - 1)
    if to_offset is not None:
        last = min(last, to_offset)
    return Span(position.committed, last) if last >= position.committed else None


def remote_reads(reads: Span, position: GroupPosition) -> Span | None:
    """The part of the next reads that comes from remote storage: what lies before
    the partition's local log (all of it where the broker did not say where that
    starts); None when the leader's disk holds all of it. Without this bound the
    last remote segment, listed open-ended, would be warmed for any lag."""
    if position.local_start is None:
        return reads
    last = position.local_start - 1 if reads.last is None else \
        min(reads.last, position.local_start - 1)
    return Span(reads.first, last) if last >= reads.first else None


def resolve_groups(replays: Sequence[Replay],
                   positions: Mapping[int, Mapping[int, GroupPosition]],
                   ) -> tuple[tuple[Replay, ...], tuple[GroupLag, ...]]:
    """The plan's replays with each group replay replaced by one offset replay per
    partition that has records to read, and each group's lag."""
    resolved: list[Replay] = []
    lags: list[GroupLag] = []
    for index, replay in enumerate(replays):
        if replay.group is None:
            resolved.append(replay)
            continue
        to_offset = replay.offsets.last if replay.offsets is not None else None
        ranges: dict[int, Span] = {}
        caught_up, uncommitted = [], []
        lag = 0
        for partition, position in sorted(positions.get(index, {}).items()):
            if position.committed is None:
                uncommitted.append(partition)
                continue
            lag += max(0, position.end - position.committed)
            span = next_reads(position, to_offset)
            if span is None:
                caught_up.append(partition)
                continue
            ranges[partition] = span
            remote = remote_reads(span, position)
            if remote is not None:
                resolved.append(Replay(replay.where, replay.topic, (partition,), remote,
                                       group=replay.group))
        lags.append(GroupLag(replay.where, replay.group, replay.topic, lag,
                             tuple(ranges), tuple(caught_up), tuple(uncommitted),
                             ranges=ranges))
    return tuple(resolved), tuple(lags)
