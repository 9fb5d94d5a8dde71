"""Origin bandwidth shared by three priority lanes: pure token buckets, clock handed in.

One bucket holds the total origin budget (bytes/s); the `prefetch` and `warm`
lanes also have buckets of their own, refilled at their share of the total.

- `foreground` (a reader is waiting) always takes what it needs at once, going
  into debt if it must, and then waits only for its own debt: it never queues
  behind read-ahead or warm-up.
- `prefetch` and `warm` take only tokens that are there beyond a foreground
  reserve (about one block), from both their own bucket and the total; while
  foreground has drawn the total below the reserve they wait. So they yield to
  foreground, never exceed their share, and a foreground block read finds its
  tokens waiting even when the lower lanes saturate the budget.

Over any interval the total taken stays within rate x interval + burst.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sidecar.model import FOREGROUND, PREFETCH, WARM


@dataclass
class TokenBucket:
    rate: float  # tokens (bytes) per second
    burst: float  # most tokens it holds
    tokens: float
    stamp: float

    def refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_for(self, amount: float) -> float:
        """Seconds until `amount` tokens are there (0 when they are)."""
        return max(0.0, (amount - self.tokens) / self.rate)


@dataclass(frozen=True)
class Grant:
    taken: bool  # the bytes were granted (after `wait`, for foreground)
    wait: float  # seconds to sleep: before using them, or before asking again


class LaneLimiter:
    def __init__(
        self,
        rate: float | None,
        shares: Mapping[str, float],
        clock: Callable[[], float],
        burst_s: float = 0.05,
        min_burst: float = 512 * 1024,
        foreground_reserve: float = 0.0,
    ) -> None:
        """`rate` None is unlimited; `shares` maps prefetch/warm to fractions of it."""
        self._clock = clock
        self._reserve = foreground_reserve
        self._total: TokenBucket | None = None
        self._lanes: dict[str, TokenBucket] = {}
        if rate is None:
            return
        now = clock()
        lane_burst = max(min_burst, rate * burst_s)
        burst = lane_burst + foreground_reserve
        self._total = TokenBucket(rate, burst, burst, now)
        for lane in (PREFETCH, WARM):
            share = shares.get(lane, 1.0)
            if not 0.0 < share <= 1.0:
                raise ValueError(f"share of lane {lane} must be in (0, 1], got {share}")
            self._lanes[lane] = TokenBucket(
                rate * share, lane_burst * share, lane_burst * share, now
            )

    @property
    def limited(self) -> bool:
        return self._total is not None

    def continue_from(self, previous: LaneLimiter) -> None:
        """Replacing `previous` (a reload): start from its tokens, not full.

        A new limiter's buckets start full, so a reload would forgive the
        foreground's debt and hand the lower lanes a fresh burst: the total
        taken would exceed rate x interval + burst at every SIGHUP. Each bucket
        keeps what it held (its debt too), capped at its new burst."""
        if self._total is None or previous._total is None:
            return
        now = self._clock()
        for lane, bucket in [(FOREGROUND, self._total), *self._lanes.items()]:
            old = previous._total if lane == FOREGROUND else previous._lanes[lane]
            old.refill(now)
            bucket.tokens = min(bucket.burst, old.tokens)
            bucket.stamp = now

    def foreground_wait(self) -> float:
        """Seconds until the foreground's debt is paid (0 when there is none)."""
        total = self._total
        if total is None:
            return 0.0
        total.refill(self._clock())
        return max(0.0, -total.tokens / total.rate)

    def take(self, lane: str, amount: int) -> Grant:
        total = self._total
        if total is None:
            return Grant(True, 0.0)
        now = self._clock()
        total.refill(now)
        if lane == FOREGROUND:
            total.tokens -= amount
            return Grant(True, max(0.0, -total.tokens / total.rate))
        own = self._lanes[lane]
        own.refill(now)
        # A chunk larger than a bucket could ever hold is taken when it is full.
        need_total = min(amount, total.burst - self._reserve) + self._reserve
        need_own = min(amount, own.burst)
        wait = max(total.wait_for(need_total), own.wait_for(need_own))
        if wait > 0:
            return Grant(False, wait)
        total.tokens -= amount
        own.tokens -= amount
        return Grant(True, 0.0)
