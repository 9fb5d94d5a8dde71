"""Origin bandwidth lanes with a fake clock: caps, shares and foreground priority."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry

from sidecar.isolation.lanes import LaneLimiter
from sidecar.model import FOREGROUND, PREFETCH, WARM
from sidecar.origin.bandwidth import Bandwidth
from sidecar.telemetry.metrics import Metrics
from tests.support.clock import FakeClock

MiB = 1024 * 1024
CHUNK = 256 * 1024


def drive(limiter: LaneLimiter, clock: FakeClock, lanes: dict[str, int], seconds: float,
          step: float = 0.001) -> dict[str, int]:
    """Lanes that always want more, each taking CHUNKs whenever granted; bytes per lane."""
    got = {lane: 0 for lane in lanes}
    ready_at = {lane: 0.0 for lane in lanes}
    while clock.now < seconds:
        for lane in lanes:
            if clock.now >= ready_at[lane]:
                grant = limiter.take(lane, CHUNK)
                ready_at[lane] = clock.now + grant.wait
                if grant.taken:
                    got[lane] += CHUNK
        clock.advance(step)
    return got


def test_total_rate_holds_within_burst() -> None:
    clock = FakeClock()
    limiter = LaneLimiter(32 * MiB, {PREFETCH: 1.0, WARM: 1.0}, clock, foreground_reserve=MiB)
    got = drive(limiter, clock, {FOREGROUND: 0, PREFETCH: 0, WARM: 0}, seconds=5)
    total = sum(got.values())
    assert 0.98 * 32 * MiB * 5 <= total <= 32 * MiB * 5 + 4 * MiB


def test_lower_lanes_keep_to_their_shares() -> None:
    clock = FakeClock()
    limiter = LaneLimiter(40 * MiB, {PREFETCH: 0.5, WARM: 0.25}, clock)
    got = drive(limiter, clock, {PREFETCH: 0, WARM: 0}, seconds=4)
    assert got[PREFETCH] == pytest.approx(0.5 * 40 * MiB * 4, rel=0.05)
    assert got[WARM] == pytest.approx(0.25 * 40 * MiB * 4, rel=0.06)


def test_foreground_block_never_waits_behind_saturating_lower_lanes() -> None:
    clock = FakeClock()
    limiter = LaneLimiter(32 * MiB, {PREFETCH: 1.0, WARM: 1.0}, clock, foreground_reserve=8 * MiB)
    drive(limiter, clock, {PREFETCH: 0, WARM: 0}, seconds=3)  # they take all they can
    waits = []
    for _ in range(32):  # an 8 MiB block in chunks, as the origin reader takes it
        grant = limiter.take(FOREGROUND, CHUNK)
        assert grant.taken
        waits.append(grant.wait)
    assert max(waits) == 0.0


def test_foreground_debt_holds_back_lower_lanes() -> None:
    clock = FakeClock()
    limiter = LaneLimiter(16 * MiB, {PREFETCH: 1.0}, clock)
    first = limiter.take(FOREGROUND, 8 * MiB)
    assert first.taken and first.wait > 0.4  # beyond the burst: it waits its own debt
    grant = limiter.take(PREFETCH, CHUNK)
    assert not grant.taken and grant.wait >= first.wait


def test_unlimited_never_waits() -> None:
    limiter = LaneLimiter(None, {}, FakeClock())
    assert not limiter.limited
    assert limiter.take(WARM, 10**9).wait == 0.0


def test_bad_share_is_rejected() -> None:
    with pytest.raises(ValueError, match="share of lane warm"):
        LaneLimiter(MiB, {WARM: 1.5}, FakeClock())


def test_reload_keeps_the_foreground_debt_and_gives_no_fresh_burst() -> None:
    clock = FakeClock()
    old = LaneLimiter(16 * MiB, {PREFETCH: 1.0}, clock)
    bandwidth = Bandwidth(old, Metrics(CollectorRegistry()))
    debt = old.take(FOREGROUND, 8 * MiB)
    clock.advance(0.1)
    new = LaneLimiter(16 * MiB, {PREFETCH: 1.0}, clock)
    bandwidth.replace(new)  # a SIGHUP reload while the debt is being paid
    grant = new.take(PREFETCH, CHUNK)
    assert not grant.taken and grant.wait >= debt.wait - 0.1
    # A rate lowered by the reload keeps at most the new, smaller burst.
    clock.advance(10)
    lower = LaneLimiter(MiB, {PREFETCH: 1.0}, clock)
    bandwidth.replace(lower)
    drained = drive(lower, clock, {PREFETCH: 0}, seconds=clock.now + 2)
    assert drained[PREFETCH] <= 2 * MiB + 512 * 1024


def test_a_pacer_made_while_unlimited_takes_a_limit_a_reload_adds() -> None:
    """A fetch's pacer looks the lanes up at every chunk: begun unlimited, its
    next chunk after a reload is taken from the new limit (and counted there)."""
    clock = FakeClock()
    bandwidth = Bandwidth(LaneLimiter(None, {}, clock), Metrics(CollectorRegistry()))
    pace = bandwidth.pacer(FOREGROUND)
    pace(4 * MiB)  # unlimited: nothing to take
    limited = LaneLimiter(MiB, {}, clock)  # a burst of 512 KiB
    bandwidth.replace(limited)
    pace(CHUNK)  # within the burst: no wait, but taken
    assert limited.take(FOREGROUND, 512 * 1024).wait == pytest.approx(CHUNK / MiB)
    bandwidth.replace(LaneLimiter(None, {}, clock))  # lifted again: no wait at all
    pace(64 * MiB)


def _pace_in_thread(pace: Callable[[int], None], amount: int) -> threading.Thread:
    thread = threading.Thread(target=pace, args=(amount,), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("lane", [PREFETCH, FOREGROUND])
def test_a_reload_lifting_the_limit_frees_a_fetch_already_waiting(lane: str) -> None:
    """A fetch thread waiting for its budget at a low rate (here a minute for
    the foreground's debt) goes on at once when a reload lifts the limit; it
    used to sleep the whole wait worked out at the old rate."""
    bandwidth = Bandwidth(LaneLimiter(64 * 1024, {PREFETCH: 1.0}, time.monotonic),
                          Metrics(CollectorRegistry()))
    if lane == PREFETCH:
        with bandwidth._lock:  # a foreground read put the budget a minute in debt
            bandwidth._limiter.take(FOREGROUND, 64 * 1024 * 60)
        amount = CHUNK
    else:
        amount = 64 * 1024 * 60  # one foreground chunk a minute's worth at this rate
    thread = _pace_in_thread(bandwidth.pacer(lane), amount)
    thread.join(0.2)
    assert thread.is_alive()  # waiting for its budget, as it should at this rate
    bandwidth.replace(LaneLimiter(None, {}, time.monotonic))
    thread.join(5)
    assert not thread.is_alive()


def test_the_stop_frees_a_foreground_fetch_paying_its_debt() -> None:
    bandwidth = Bandwidth(LaneLimiter(64 * 1024, {}, time.monotonic),
                          Metrics(CollectorRegistry()))
    failed: list[BaseException] = []

    def pace() -> None:
        try:
            bandwidth.pacer(FOREGROUND)(64 * 1024 * 60)
        except ConnectionAbortedError as exc:
            failed.append(exc)

    thread = threading.Thread(target=pace, daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()
    bandwidth.close()
    thread.join(5)
    assert not thread.is_alive() and len(failed) == 1


@pytest.mark.parametrize("lane", [PREFETCH, FOREGROUND])
async def test_a_reload_lifting_the_limit_frees_a_bypass_read_already_waiting(
    lane: str,
) -> None:
    """The loop's reads (bypass) wait for their budget too: a reload lifting
    the limit reaches one already waiting a minute for it."""
    bandwidth = Bandwidth(LaneLimiter(64 * 1024, {PREFETCH: 1.0}, time.monotonic),
                          Metrics(CollectorRegistry()))
    amount = 64 * 1024 * 60
    if lane == PREFETCH:
        with bandwidth._lock:  # a foreground read put the budget a minute in debt
            bandwidth._limiter.take(FOREGROUND, amount)
        amount = CHUNK
    read = asyncio.ensure_future(bandwidth.throttle(lane, amount))
    done, _ = await asyncio.wait([read], timeout=0.2)
    assert not done  # waiting for its budget, as it should at this rate
    bandwidth.replace(LaneLimiter(None, {}, time.monotonic))
    waited = await asyncio.wait_for(read, 5)
    assert 0 < waited < 5


def test_a_wait_a_reload_cuts_short_is_counted_as_waited_not_as_planned() -> None:
    """A foreground fetch a minute in debt at 64 KiB/s, woken by a reload that
    raises the limit, waits out the rest of its debt at the new rate: the
    metric counts the seconds it waited. It used to count the whole minute
    planned at the old rate, then the new wait on top."""
    metrics = Metrics(CollectorRegistry())
    bandwidth = Bandwidth(LaneLimiter(64 * 1024, {}, time.monotonic), metrics)
    began = time.monotonic()
    thread = _pace_in_thread(bandwidth.pacer(FOREGROUND), 64 * 1024 * 60)
    # Its debt is taken under the lock that also hands it the event a reload
    # sets: from here on the reload wakes it, even before it starts waiting.
    while True:
        with bandwidth._lock:
            if bandwidth._limiter.foreground_wait() > 30:
                break
        assert thread.is_alive()
        time.sleep(0.001)
    bandwidth.replace(LaneLimiter(64 * MiB, {}, time.monotonic))
    thread.join(5)
    assert not thread.is_alive()
    took = time.monotonic() - began
    counted = metrics.ratelimit_wait.labels(FOREGROUND)._value.get()
    assert 0 < counted <= took
