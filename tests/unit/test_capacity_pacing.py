"""How the capacity replay shares a read's time out over its blocks (capacity/pacing.py)."""

from __future__ import annotations

import random

import pytest

from spark_warmup.capacity.pacing import EVEN, BlockCosts, PaceTally, costs_of, tally_read
from spark_warmup.capacity.simulate import Read, Replay, Settings

MiB = 1024 * 1024
KEY = "orders-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
SETTINGS = Settings(block_size=MiB, max_window_bytes=8 * MiB, max_in_flight=4)


def test_a_fetched_read_reaches_its_first_block_when_its_answer_comes() -> None:
    """Three blocks fetched in one run: the first takes the wait for the
    answer, the two after it come in the same answer, just after it. The
    read-ahead planned at each delivered block goes out at the end of the
    wait, as the sidecar's does, not a third of the way in."""
    costs = BlockCosts(cached=0.001, joined=0.05, first_fetched=0.2, next_fetched=0.05)
    fetched = Read(1.0, "tiered", KEY, '"e"', 8 * MiB, 0, 3 * MiB, False, duration_s=0.3,
                   found="fff")
    simulation = Replay(SETTINGS, 64 * (MiB + 4096), keys=[("tiered", KEY, '"e"', 8 * MiB)],
                        costs=costs)
    reached = list(simulation.steps(fetched))  # blocks 0, 1, 2: reached, then out, each
    assert reached == pytest.approx([0.7, 0.9, 0.9, 0.95, 0.95, 1.0])
    # A cached block takes next to no time, then the run it fetched.
    then = Read(3.0, "tiered", KEY, '"e"', 8 * MiB, 3 * MiB, 3 * MiB, False, duration_s=0.251,
                found="cff")
    simulation = Replay(SETTINGS, 64 * (MiB + 4096), keys=[("tiered", KEY, '"e"', 8 * MiB)],
                        costs=costs)
    assert list(simulation.steps(then)) == pytest.approx(
        [2.749, 2.75, 2.75, 2.95, 2.95, 3.0])


def test_without_the_log_s_letters_a_read_s_time_is_shared_evenly() -> None:
    costs = BlockCosts(0.0, 0.05, 0.2, 0.05)
    assert costs.weights("", 3, resumed_first=False) == [1.0, 1.0, 1.0]
    assert costs.weights("ff", 3, resumed_first=False) == [1.0, 1.0, 1.0]  # not this read's
    assert EVEN.weights("cff", 3, resumed_first=False) == [1.0, 1.0, 1.0]
    # The block a stream resumes takes none, whatever it was.
    assert costs.weights("jff", 3, resumed_first=True) == [0.0, 0.2, 0.05]
    # All cached, at no cost: evenly rather than a division by nothing.
    assert costs.weights("cc", 2, resumed_first=False) == [1.0, 1.0]


def test_costs_come_from_the_log_s_reads_of_one_kind_of_block() -> None:
    block = MiB
    reads = [
        ("ccc", 0, block, 0.003), ("cc", 0, block, 0.002),  # 1 ms a block
        ("jj", 0, block, 0.1), ("j", 0, block, 0.05),  # 50 ms a block
        ("ff", 0, block, 0.25), ("fff", 0, block, 0.3), ("ff", 0, block, 0.25),
        ("fff", 0, block, 0.3),  # 0.2 s for the first, 0.05 s each after it
        ("cjf", 0, block, 9.0), ("fc", 0, block, 9.0),  # mixed: not counted
        # The block a read starting inside it resumes is left out: "jj" alike.
        ("cjj", block // 2, block, 0.1),
    ]
    costs = costs_of(reads)
    assert costs.cached == pytest.approx(0.001)
    assert costs.joined == pytest.approx(0.05)
    assert costs.first_fetched == pytest.approx(0.2)
    assert costs.next_fetched == pytest.approx(0.05)


def test_a_log_that_cannot_say_shares_evenly() -> None:
    assert costs_of([]) is EVEN
    assert costs_of([("ccc", 0, MiB, 0.003), ("fff", 0, MiB, 0.3)]) is EVEN  # none joined
    assert costs_of([("jj", 0, MiB, 0.1), ("cc", 0, MiB, 0.002)]) is EVEN  # none fetched
    # Runs of one length only: each block of a run alike.
    costs = costs_of([("j", 0, MiB, 0.05), ("ff", 0, MiB, 0.2), ("ff", 0, MiB, 0.3)])
    assert (costs.first_fetched, costs.next_fetched) == pytest.approx((0.125, 0.125))


def test_the_sums_added_in_any_order_give_the_same_costs() -> None:
    """A Spark job adds each node's sums up over its executors in an order of
    its own: the costs, and so the replay, must be the local run's exactly."""
    rng = random.Random(7)
    reads = [(rng.choice(["c", "cc", "j", "jjj", "f", "ff", "fff", "cf"]), 0, MiB,
              rng.uniform(0.001, 0.5)) for _ in range(500)]
    whole = costs_of(reads)
    parts: list[PaceTally] = []
    for start in range(0, len(reads), 37):
        part = PaceTally()
        for read in reversed(reads[start:start + 37]):
            part = part + tally_read(*read)
        parts.append(part)
    rng.shuffle(parts)
    total = PaceTally()
    for part in parts:
        total = part + total
    assert total.costs() == whole
