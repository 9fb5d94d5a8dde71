"""Where a read's time goes among its blocks, as a node's log shows it. Pure.

The replay reaches a read's blocks over the read's logged duration, and plans
read-ahead as each block is delivered (sidecar/engine/serving.py tells the
planner at each piece the client took). Shared out evenly, a read that fetched
its three missing blocks in one answer had its first block delivered a third
of the way in, and its read-ahead started there; the sidecar has the first
block only once the answer's first bytes come, most of the read's time with
an object store's latency, and its read-ahead starts from there. Even shares
made the replay read ahead sooner than the sidecar could, and it predicted
more byte hits than the sidecar's own log measured (bench/ANALYSIS.md).

So a read's duration is shared out by what each kind of block costs in the
same log: one found cached, one joined on its way, and, for blocks the
request fetched, the first of its run and each one after it (which come in
the same answer). The costs are estimated from the log's reads made of one
kind of block: the time per block of reads found all cached, of reads
all joined, and for reads that fetched all their blocks in one run, a least
squares line of duration against the run's length (its intercept plus one
slope: the first block; the slope: each one after it). The block a stream's
previous read ended in (a read starting inside a block) is left out: its
bytes were on their way or in hand.

Estimated as sums of whole microseconds, so a Spark job adds them up per
node over its executors in any order and gets the costs one machine gets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass

from spark_warmup.capacity.trace import CACHED, FETCHED, JOINED


@dataclass(frozen=True)
class BlockCosts:
    """Seconds a block of each kind takes a reader, as weights of its read's time."""

    cached: float
    joined: float
    first_fetched: float  # the first block of a run the request fetched
    next_fetched: float  # each block after it, in the same answer

    def weights(self, found: str, blocks: int, resumed_first: bool) -> list[float]:
        """Each block's share of a read of `blocks` blocks, by how the log found
        it (`found`, one letter a block; not known: even shares). The resumed
        first block (`resumed_first`) takes none."""
        if len(found) == blocks:
            weights = [self._cost(found, index) for index in range(blocks)]
        else:
            weights = [1.0] * blocks
        return _resumed(weights, resumed_first)

    def _cost(self, found: str, index: int) -> float:
        how = found[index]
        if how == CACHED:
            return self.cached
        if how == JOINED:
            return self.joined
        if how == FETCHED and index > 0 and found[index - 1] == FETCHED:
            return self.next_fetched
        return self.first_fetched


EVEN = BlockCosts(1.0, 1.0, 1.0, 1.0)


def _resumed(weights: list[float], resumed_first: bool) -> list[float]:
    """The resumed first block takes none; the others nothing to go by: evenly."""
    skipped = 1 if resumed_first and len(weights) > 1 else 0
    if sum(weights[skipped:]) <= 0:
        weights = [1.0] * len(weights)
    return [0.0] * skipped + weights[skipped:]


@dataclass(frozen=True)
class PaceTally:
    """The sums BlockCosts are estimated from, added up over a node's reads.
    Whole microseconds (the log's precision): sums of integers come out the
    same in any order, so a Spark job's costs are the local replay's exactly."""

    cached_us: int = 0  # reads found all cached: their time and their blocks
    cached_blocks: int = 0
    joined_us: int = 0
    joined_blocks: int = 0
    # Reads that fetched all their blocks in one run: the run's length less
    # one (x) against the read's duration (y).
    runs: int = 0
    sum_x: int = 0
    sum_y: int = 0
    sum_xx: int = 0
    sum_xy: int = 0

    def __add__(self, other: PaceTally) -> PaceTally:
        return PaceTally(*(a + b for a, b in zip(astuple(self), astuple(other), strict=True)))

    def costs(self) -> BlockCosts:
        """The costs these sums give; even shares where the log has too few
        reads of a kind to say (no read fetched in one run, or none joined)."""
        if self.runs == 0 or self.joined_blocks == 0:
            return EVEN
        spread = self.runs * self.sum_xx - self.sum_x * self.sum_x
        if spread > 0:
            slope = max(0.0, (self.runs * self.sum_xy - self.sum_x * self.sum_y) / spread)
            first = max(0.0, (self.sum_y - slope * self.sum_x) / self.runs)
        else:  # every run of one length: each block alike
            first = slope = self.sum_y / (self.sum_x + self.runs)
        if first <= 0:
            return EVEN
        cached = self.cached_us / self.cached_blocks if self.cached_blocks else 0.0
        return BlockCosts(cached / 1e6, self.joined_us / self.joined_blocks / 1e6,
                          first / 1e6, slope / 1e6)


def tally_read(found: str, first_byte: int, block_size: int, duration_s: float) -> PaceTally:
    """One logged read's part of the sums: counted only if its blocks (the one a
    read starting inside a block resumes left out) were all of one kind."""
    kinds = found[1:] if block_size > 0 and first_byte % block_size else found
    duration_us = round(duration_s * 1e6)
    if not kinds or duration_us < 0:
        return PaceTally()
    blocks = len(kinds)
    if kinds == CACHED * blocks:
        return PaceTally(cached_us=duration_us, cached_blocks=blocks)
    if kinds == JOINED * blocks:
        return PaceTally(joined_us=duration_us, joined_blocks=blocks)
    if kinds == FETCHED * blocks:
        x = blocks - 1
        return PaceTally(runs=1, sum_x=x, sum_y=duration_us, sum_xx=x * x,
                         sum_xy=x * duration_us)
    return PaceTally()


def costs_of(reads: Sequence[tuple[str, int, int, float]]) -> BlockCosts:
    """The costs of a node's reads: (found, first byte, block size, duration)."""
    total = PaceTally()
    for read in reads:
        total = total + tally_read(*read)
    return total.costs()

