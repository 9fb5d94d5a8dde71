"""The read-ahead planner: its accounting and bounds, driven by hand (it is pure).

The tests play the engine: they tell the planner what happened and start what
it answers, keeping a set of blocks "fetched" the way the engine's in-flight
table and cache would.
"""

from __future__ import annotations

from datetime import UTC, datetime

from sidecar.cache import BlockIdent
from sidecar.layout import Layout
from sidecar.model import ObjectInfo
from sidecar.prefetch.planner import NO_SUCCESSOR_S, NextSegment, ReadAheadPlanner
from sidecar.prefetch.streams import Stream, StreamTable
from tests.support.clock import FakeClock

B = 1000
PARTITION = "orders-AAAAAAAAAAAAAAAAAAAAAA/0/"
KEY = PARTITION + "00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
NEXT_KEY = PARTITION + "00000000000000000040-CCCCCCCCCCCCCCCCCCCCCC.log"
INFO = ObjectInfo("b", KEY, 40 * B, '"e"', datetime(2026, 1, 1, tzinfo=UTC))


def ident(block: int, info: ObjectInfo = INFO) -> BlockIdent:
    return BlockIdent(info.bucket, info.key, info.etag, block)


class Driver:
    """The engine's side: starts what the planner admits, remembers what it started."""

    def __init__(self, planner: ReadAheadPlanner) -> None:
        self.planner = planner
        self.started: list[int] = []
        self.present: set[BlockIdent] = set()

    def fetch(self, start: int, length: int = 300) -> Stream:
        """One broker-like fetch: a request at `start`, `length` bytes delivered."""
        stream = self.planner.on_request(INFO, start)
        for position in (start, start + length):
            plan = self.planner.on_delivered(stream, INFO, position)
            for block in plan.blocks:
                if ident(block) in self.present:
                    continue
                if not self.planner.admit(ident(block), stream):
                    break
                self.present.add(ident(block))
                self.started.append(block)
        return stream


def planner(max_in_flight: int = 16, max_pending: int = 100,
            layout: Layout = Layout.PLAIN) -> ReadAheadPlanner:
    table = StreamTable(block_size=B, max_window_blocks=8, idle_s=60, clock=FakeClock())
    return ReadAheadPlanner(table, max_in_flight=max_in_flight, max_pending=max_pending,
                            layout=layout)


def test_used_grows_the_window_wasted_shrinks_it() -> None:
    driver = Driver(planner())
    for start in (0, 300, 600):
        stream = driver.fetch(start)
    assert driver.started == [1]
    driver.planner.finished(ident(1), cached=True)
    assert driver.planner.on_block_read(ident(1)) is True
    driver.fetch(900)  # window 2: blocks 2, 3
    assert driver.started == [1, 2, 3]
    assert driver.planner.on_evicted(ident(3)) is True
    assert stream.window == 1
    # An eviction of a block nobody read ahead, or a second read, is nothing.
    assert driver.planner.on_evicted(ident(30)) is False
    assert driver.planner.on_block_read(ident(1)) is False


def test_in_flight_bound_defers_blocks_until_fetches_finish() -> None:
    driver = Driver(planner(max_in_flight=2))
    for start in (0, 300, 600):
        stream = driver.fetch(start)
    for _ in range(3):
        stream.used(8)  # window 8
    driver.fetch(900)
    assert driver.started == [1, 2] and driver.planner.blocks_in_flight == 2
    for block in (1, 2):
        driver.planner.finished(ident(block), cached=True)
    driver.fetch(1200)
    assert driver.started == [1, 2, 3, 4]  # the deferred ones, two at a time


def test_pending_share_bounds_read_ahead_nobody_has_read() -> None:
    driver = Driver(planner(max_pending=3))
    for start in (0, 300, 600):
        stream = driver.fetch(start)
    for _ in range(3):
        stream.used(8)
    driver.fetch(900)
    assert driver.started == [1, 2, 3] and driver.planner.pending_blocks == 3
    for block in (1, 2, 3):
        driver.planner.finished(ident(block), cached=True)
    driver.fetch(1200)
    assert driver.started == [1, 2, 3]  # cached but unread: the share is full
    assert driver.planner.on_block_read(ident(1))
    driver.fetch(1500)
    assert driver.started == [1, 2, 3, 4]


def test_a_failed_read_ahead_is_no_longer_pending() -> None:
    driver = Driver(planner())
    for start in (0, 300, 600):
        driver.fetch(start)
    driver.planner.finished(ident(1), cached=False)
    assert driver.planner.pending_blocks == 0 and driver.planner.blocks_in_flight == 0
    assert driver.planner.on_block_read(ident(1)) is False


def test_random_requests_plan_nothing() -> None:
    driver = Driver(planner())
    for start in (17_000, 3_100, 29_500, 8_000, 36_200, 12_900):
        driver.fetch(start)
    assert driver.started == []


def test_a_window_past_the_segment_end_asks_for_the_next_segment() -> None:
    plan_for = planner(layout=Layout.AIVEN)
    stream = plan_for.on_request(INFO, 38 * B)
    plan_for.on_delivered(stream, INFO, 38 * B)
    plan = plan_for.on_delivered(stream, INFO, 40 * B)  # two whole blocks: sequential
    assert plan.next_segment is not None
    wanted = plan.next_segment
    assert wanted.partition_prefix == PARTITION and wanted.after is INFO
    # Asked once per reach: the same delivery again asks nothing more.
    assert plan_for.on_delivered(stream, INFO, 40 * B).next_segment is None
    keys = [KEY, NEXT_KEY, PARTITION + "00000000000000000040-CCCCCCCCCCCCCCCCCCCCCC.indexes"]
    assert plan_for.next_key(wanted, keys) == NEXT_KEY
    next_info = ObjectInfo("b", NEXT_KEY, 5 * B, '"n"', INFO.last_modified)
    blocks = plan_for.continue_into(wanted, next_info)
    assert list(blocks) == list(range(min(wanted.blocks, 5)))
    # The reader that opens the next segment inherits the window: sequential at once.
    follower = plan_for.on_request(next_info, 0)
    assert follower.sequential and follower.window == stream.window


IDLE_S = 1.0


def successors_planner(clock: FakeClock) -> ReadAheadPlanner:
    return ReadAheadPlanner(
        StreamTable(block_size=B, max_window_blocks=8, idle_s=IDLE_S, clock=clock),
        max_in_flight=16, max_pending=100, layout=Layout.AIVEN)


def reach_past_the_end(plan_for: ReadAheadPlanner, clock: FakeClock) -> NextSegment | None:
    """A new reader (the last one's head has expired) reads the segment's last
    blocks: what its reach past the end asks."""
    clock.advance(2 * IDLE_S)
    stream = plan_for.on_request(INFO, 38 * B)
    plan_for.on_delivered(stream, INFO, 38 * B)
    return plan_for.on_delivered(stream, INFO, 40 * B).next_segment


def test_the_next_segment_is_listed_once_and_then_known() -> None:
    clock = FakeClock()
    plan_for = successors_planner(clock)
    first = reach_past_the_end(plan_for, clock)
    assert first is not None and first.known is None  # to be listed
    # While that look-up is under way, another reader's reach asks nothing.
    assert reach_past_the_end(plan_for, clock) is None
    assert plan_for.next_key(first, [KEY, NEXT_KEY]) == NEXT_KEY
    # Then every reach goes straight to the successor: no listing.
    later = reach_past_the_end(plan_for, clock)
    assert later is not None and later.known == NEXT_KEY
    # A successor gone when looked up (HEAD 404) is listed afresh next time.
    plan_for.forget(later)
    again = reach_past_the_end(plan_for, clock)
    assert again is not None and again.known is None


def test_a_segment_with_no_successor_yet_is_listed_again_after_a_while() -> None:
    clock = FakeClock()
    plan_for = successors_planner(clock)
    wanted = reach_past_the_end(plan_for, clock)
    assert wanted is not None and plan_for.next_key(wanted, [KEY]) is None
    clock.advance(NO_SUCCESSOR_S / 2 - 2 * IDLE_S)
    assert reach_past_the_end(plan_for, clock) is None
    clock.advance(NO_SUCCESSOR_S / 2)  # the broker may have uploaded it since
    later = reach_past_the_end(plan_for, clock)
    assert later is not None and later.known is None


def test_plain_layout_never_looks_for_a_next_segment() -> None:
    plan_for = planner(layout=Layout.PLAIN)
    stream = plan_for.on_request(INFO, 38 * B)
    plan_for.on_delivered(stream, INFO, 38 * B)
    assert plan_for.on_delivered(stream, INFO, 40 * B).next_segment is None


def test_only_a_segment_log_read_to_its_end_asks_for_the_next_segment() -> None:
    """A segment's manifest and indexes are read whole before its `.log`: read
    to their end they say nothing of the next segment, whose `.log` would be
    fetched ahead (and its reader handed a window) for no reader."""
    for suffix in ("indexes", "rsm-manifest"):
        small = ObjectInfo("b", KEY.removesuffix("log") + suffix, 3 * B, '"s"',
                           INFO.last_modified)
        plan_for = planner(layout=Layout.AIVEN)
        stream = plan_for.on_request(small, 0)
        plan = plan_for.on_delivered(stream, small, 3 * B)  # read whole: sequential
        assert stream.sequential and plan.next_segment is None, suffix
