"""How long a background fetch takes to land, at each moment of a node's log. Pure.

The replay lands a read-ahead fetch when the sidecar's would have: the log's
FETCH lines say how long theirs took, from the fetch's start (its wait for a
slot included) to its block being cached. How many are in flight at once, the
sidecar's read-ahead bound (prefetch_max_in_flight), goes by how long each
takes (Little's law), and that changes over a run with the origin's load: in
the accuracy grid's 16-stream runs the fetches that started in the first
quarter second, every reader missing at once, took 0.18 s on average, those of
the last one 0.07 s. One mean for the whole log held the replay's read-ahead in
flight too short while the origin was busy, and it read ahead where the
sidecar's bound refused (3 to 7 points of byte hit ratio too optimistic at 16
streams with caches of half the working set or more, bench/ANALYSIS.md). So a
fetch started at a moment takes the mean duration of the log's fetches started
in the same BIN_S of time.

Where the log has none then, it lands between the landings of the log's
fetches started just before and just after (their durations interpolated by
the moment): the origin's workers take read-ahead first come first served,
behind every foreground read (sidecar/origin/workers.py), so a fetch started
between two others lands between them. A bin without a fetch is most often
one where the sidecar's read-ahead bound was full because the origin was
slow, and the mean of the whole log there let the replay read ahead where the
sidecar could not (bench/ANALYSIS.md, 48 streams). Before the log's first
fetch and after its last, the nearest bin's.

Means, not medians: how many are in flight goes by the mean time in flight,
and with many streams at once the durations have a long tail (a median of
63 ms beside a mean of 381 ms).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

# Short beside a run (the origin's load moves over seconds), about one fetch's
# duration: a bin holds the fetches in flight together.
BIN_S = 0.1


def time_bin(when_s: float, bin_s: float = BIN_S) -> int:
    """The bin a moment (seconds since the epoch) falls in."""
    return math.floor(when_s / bin_s)


@dataclass(frozen=True)
class FetchTimes:
    """Mean fetch durations per bin of start time, and over the whole log."""

    mean_s: float = 0.0  # no FETCH lines (an older log): lands at once
    by_bin: Mapping[int, float] = field(default_factory=dict)
    bin_s: float = BIN_S
    # The bins with fetches of their own, in order.
    _known: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_known", tuple(sorted(self.by_bin)))

    @classmethod
    def of(cls, fetches: Iterable[tuple[float, float]], bin_s: float = BIN_S) -> FetchTimes:
        """From the log's fetches as (start, duration) in seconds."""
        sums: dict[int, tuple[float, int]] = {}
        for start_s, duration_s in fetches:
            number = time_bin(start_s, bin_s)
            held, seen = sums.get(number, (0.0, 0))
            sums[number] = (held + duration_s, seen + 1)
        return cls.of_bins(sums, bin_s)

    @classmethod
    def of_bins(cls, sums: Mapping[int, tuple[float, int]], bin_s: float = BIN_S) -> FetchTimes:
        """From each bin's (sum of durations, number of fetches), as the Spark
        job aggregates them; bins of no fetch are left out."""
        kept = {number: (held, seen) for number, (held, seen) in sums.items() if seen}
        total = sum(held for held, _ in kept.values())
        count = sum(seen for _, seen in kept.values())
        return cls(total / count if count else 0.0,
                   {number: held / seen for number, (held, seen) in kept.items()}, bin_s)

    def at(self, when_s: float) -> float:
        """How long a fetch started at `when_s` takes to land."""
        number = time_bin(when_s, self.bin_s)
        held = self.by_bin.get(number)
        if held is not None:
            return held
        known = self._known
        if not known:
            return self.mean_s
        after = bisect.bisect(known, number)
        if after == 0:
            return self.by_bin[known[0]]
        if after == len(known):
            return self.by_bin[known[-1]]
        before, later = known[after - 1], known[after]
        share = (number - before) / (later - before)
        return self.by_bin[before] + share * (self.by_bin[later] - self.by_bin[before])


# How a fetch's time follows the origin's load (bench/ANALYSIS.md, the grid's
# logs), in two parts. Against the other fetches the replay started in the
# same bin: a fetch started with more blocks on their way waits behind more
# of them (MOMENT_EXPONENT). The bin's load against the log's own size's in
# the same bin: with two consumer groups and a cache that holds what the
# first read, the second's reads are hits and leave the origin to the
# first's, whose fetches answer sooner; but its readers, whose pace the
# replay keeps from the log, speed up with the origin too, so a landing's
# time moves against them by less (SIZE_EXPONENT). Exponent 1 is time in
# proportion to the load; 0 leaves the log's time as it was.
MOMENT_EXPONENT = 0.75
SIZE_EXPONENT = 0.25


@dataclass(frozen=True)
class OriginLoad:
    """How many blocks were on their way when fetches started, per bin of time,
    in the replay at the cache size the log was written at.

    The log's fetch durations are those of the origin's load then: at another
    size the sidecar asks the origin for more blocks at once, or fewer, and its
    fetches take longer, or less long. A replay scales each fetch's time by how
    many blocks it has on their way against the mean of the fetches it started
    in the same bin, and that mean against this count."""

    by_bin: Mapping[int, float] = field(default_factory=dict)
    bin_s: float = BIN_S

    def scaled(self, duration_s: float, when_s: float, on_their_way: int,
               bin_mean: float) -> float:
        """A fetch's time starting at `when_s` with `on_their_way` blocks being
        fetched, where the replay's fetches of the same bin so far had
        `bin_mean` on their way (this one's count included): the log's, where
        the log's own size had as many."""
        seen = self.by_bin.get(time_bin(when_s, self.bin_s))
        if not seen:
            return duration_s
        here = max(1.0, bin_mean)
        return (duration_s * math.pow(max(1, on_their_way) / here, MOMENT_EXPONENT)
                * math.pow(here / max(1.0, seen), SIZE_EXPONENT))


class LoadTally:
    """Counts the blocks on their way at each fetch's start, per bin: what an
    OriginLoad holds, and the mean so far of the bin a replay is in.

    With `keep_s`, only the bins of the last `keep_s` seconds are kept: a
    replay asks for the mean of the moment it is in (or of a slot's wait just
    before it), and a day's log has hundreds of thousands of bins."""

    def __init__(self, bin_s: float = BIN_S, keep_s: float | None = None) -> None:
        self.bin_s = bin_s
        self._keep = None if keep_s is None else max(1, math.ceil(keep_s / bin_s))
        self._newest: int | None = None
        self._sums: dict[int, tuple[int, int]] = {}

    def add(self, when_s: float, on_their_way: int) -> float:
        """Count one fetch's start; the mean of its bin so far, this one's included."""
        number = time_bin(when_s, self.bin_s)
        held, seen = self._sums.get(number, (0, 0))
        held, seen = held + on_their_way, seen + 1
        self._sums[number] = (held, seen)
        if self._keep is not None and (self._newest is None or number > self._newest):
            self._newest = number
            # Bins come in time order, but for a slot's wait counted late.
            while (oldest := next(iter(self._sums))) <= number - self._keep:
                del self._sums[oldest]
        return held / seen

    def __len__(self) -> int:
        """Bins held."""
        return len(self._sums)

    def load(self) -> OriginLoad:
        return OriginLoad({number: held / seen for number, (held, seen) in self._sums.items()},
                          self.bin_s)
