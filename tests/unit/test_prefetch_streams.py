"""Stream detection and window growth with scripted access sequences (pure, fake clock)."""

from __future__ import annotations

import random

from sidecar.prefetch.streams import StreamTable
from tests.support.clock import FakeClock

B = 1000  # block size
OBJ = ("b", "k", '"e"')


def table(clock: FakeClock | None = None, max_window: int = 8) -> StreamTable:
    return StreamTable(block_size=B, max_window_blocks=max_window, idle_s=60,
                       clock=clock or FakeClock())


def fetch(t: StreamTable, start: int, length: int, size: int = 100 * B) -> list[int]:
    """One broker-like fetch: attach, deliver `length` bytes; returns blocks planned."""
    stream = t.attach(OBJ, start)
    planned = list(t.plan(stream, size).blocks)
    t.advance(stream, start + length)
    planned += list(t.plan(stream, size).blocks)
    return planned


def test_first_fetch_plans_nothing_continuation_reads_ahead() -> None:
    t = table()
    assert fetch(t, 0, 300) == []
    assert fetch(t, 300, 300) == []  # one continuation may be chance
    assert fetch(t, 600, 300) == [1]
    assert fetch(t, 900, 50) == []  # block 1 already planned, window still 1
    (stream,) = t.streams(OBJ)
    assert stream.sequential and stream.position == 950


def test_window_doubles_on_use_up_to_max_and_halves_on_waste() -> None:
    t = table(max_window=8)
    fetch(t, 0, 300)
    fetch(t, 300, 300)
    fetch(t, 600, 300)
    (stream,) = t.streams(OBJ)
    for expected in (2, 4, 8, 8):
        stream.used(t.max_window)
        assert stream.window == expected
    stream.wasted()
    assert stream.window == 4
    assert fetch(t, 900, 200) == [2, 3, 4, 5]  # position 1100 -> blocks 2..1+4


def test_rereading_a_partial_batch_continues_the_stream() -> None:
    """The broker's next fetch starts at the first batch it did not get whole."""
    t = table()
    fetch(t, 0, 900)
    fetch(t, 850, 900)  # starts 50 bytes before the head
    fetch(t, 1700, 900)
    assert len(t.streams(OBJ)) == 1 and t.streams(OBJ)[0].sequential


def test_two_interleaved_consumers_keep_two_heads() -> None:
    t = table()
    for i in range(5):
        fetch(t, i * 300, 300)
        fetch(t, 50 * B + i * 300, 300)
    heads = sorted(s.position for s in t.streams(OBJ))
    assert heads == [1500, 50 * B + 1500]
    assert all(s.sequential for s in t.streams(OBJ))


def test_random_access_never_reads_ahead() -> None:
    t = table()
    rng = random.Random(7)
    planned = [b for _ in range(500)
               for b in fetch(t, rng.randrange(0, 90 * B), rng.randrange(1, 1500))]
    # A random start lands within a block of an old head now and then; that is
    # a continuation in the rules' eyes, so a few blocks may be planned, never a storm.
    assert len(planned) < 25  # about 3% of random requests (seeds 0-7), one block each
    assert len(t.streams(OBJ)) <= 8  # heads per object are bounded


def test_backwards_reader_gets_no_read_ahead() -> None:
    t = table()
    planned = [b for i in range(30, 0, -1) for b in fetch(t, i * 2 * B, 500)]
    assert planned == []


def test_restart_at_offset_zero_is_a_new_stream() -> None:
    t = table()
    for i in range(6):
        fetch(t, i * 400, 400)
    assert fetch(t, 0, 400) == []  # 2400 bytes back: not this head
    assert len(t.streams(OBJ)) == 2


def test_one_request_delivering_two_blocks_is_sequential() -> None:
    t = table()
    stream = t.attach(OBJ, 0)
    t.advance(stream, B)
    assert list(t.plan(stream, 10 * B).blocks) == []
    t.advance(stream, 2 * B)
    assert list(t.plan(stream, 10 * B).blocks) == [3]


def test_idle_heads_expire() -> None:
    clock = FakeClock()
    t = table(clock)
    fetch(t, 0, 300)
    fetch(t, 300, 300)
    clock.advance(61)
    fetch(t, 600, 300)
    (stream,) = t.streams(OBJ)
    assert not stream.sequential and stream.continuations == 0  # the old head expired


def test_window_reaching_past_the_end_reports_how_far() -> None:
    t = table(max_window=8)
    fetch(t, 0, 300, size=4 * B)
    fetch(t, 300, 100, size=4 * B)
    stream = t.attach(OBJ, 400)
    for _ in range(3):
        stream.used(t.max_window)
    t.advance(stream, 2500)
    plan = t.plan(stream, 4 * B)
    assert list(plan.blocks) == [3] and plan.beyond_end == 7  # wants blocks 3..10


def test_hand_off_gives_the_next_segment_the_window() -> None:
    t = table(max_window=8)
    fetch(t, 0, 300)
    (stream,) = t.streams(OBJ)
    stream.used(t.max_window)
    stream.used(t.max_window)
    following = ("b", "next", '"f"')
    t.hand_off(stream, following)
    successor = t.attach(following, 0)
    assert successor.sequential and successor.window == 4
    assert list(t.plan(successor, 50 * B).blocks) == [1, 2, 3, 4]


def test_a_fetch_starting_in_the_block_its_stream_ended_in_resumes_that_block() -> None:
    t = table()
    fetch(t, 0, 1600)  # ends inside block 1
    stream = t.attach(OBJ, 1600)
    assert stream.resumed_block == 1  # the same reader's block: not a reuse
    t.advance(stream, 2000)  # ends on a block boundary
    assert t.attach(OBJ, 2000).resumed_block == -1
    other = t.attach(OBJ, 50 * B + 10)  # another reader, elsewhere
    assert other is not stream and other.resumed_block == -1


def test_a_lower_max_window_holds_running_streams_and_hand_offs_at_once() -> None:
    """A reload that lowers prefetch_max_window bounds the very next plan of a
    stream whose window had grown, not only once one of its blocks is read,
    and the window a segment handed to the next one before the reload."""
    t = table(max_window=8)
    fetch(t, 0, 300)
    fetch(t, 300, 300)
    fetch(t, 600, 300)
    (stream,) = t.streams(OBJ)
    for _ in range(3):
        stream.used(t.max_window)
    assert stream.window == 8
    following = ("b", "next", '"f"')
    t.hand_off(stream, following)
    t.max_window = 2
    t.advance(stream, 1100)
    assert list(t.plan(stream, 50 * B).blocks) == [2, 3]  # blocks 2..1+2, not 2..9
    assert stream.window == 2
    successor = t.attach(following, 0)
    assert successor.window == 2
    assert list(t.plan(successor, 50 * B).blocks) == [1, 2]
