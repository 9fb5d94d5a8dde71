"""The origin circuit breaker as a state machine, on a fake clock."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.origin.breaker import BreakerSettings, BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def breaker(**settings: float) -> tuple[CircuitBreaker, Clock, list[tuple[str, str]]]:
    clock = Clock()
    changes: list[tuple[str, str]] = []
    defaults: dict[str, float] = {"failures": 3, "cool_down_s": 5.0, "min_calls": 10}
    b = CircuitBreaker(
        BreakerSettings(**{**defaults, **settings}),  # type: ignore[arg-type]
        clock, lambda old, new, why: changes.append((old.value, new.value)),
    )
    return b, clock, changes


def fail(b: CircuitBreaker, times: int) -> None:
    for _ in range(times):
        assert b.allow()
        b.failure()


def test_consecutive_failures_open_it_and_a_success_resets_the_count() -> None:
    b, _, changes = breaker()
    fail(b, 2)
    assert b.allow()
    b.success()
    fail(b, 2)
    assert b.state is BreakerState.CLOSED and b.consecutive_failures == 2
    fail(b, 1)
    assert b.state is BreakerState.OPEN and changes == [("closed", "open")]
    assert not b.allow() and not b.allow()
    assert b.rejected == 2 and b.opened == 1


def test_after_the_cool_down_one_probe_goes_through_and_its_success_closes_it() -> None:
    b, clock, changes = breaker()
    fail(b, 3)
    clock.now += 4.9
    assert not b.allow()
    clock.now += 0.1
    assert b.state is BreakerState.HALF_OPEN
    assert b.allow()  # the probe
    assert not b.allow()  # only one at a time
    b.success()
    assert b.state is BreakerState.CLOSED and b.allow()
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_a_failed_probe_opens_it_for_another_cool_down() -> None:
    b, clock, changes = breaker()
    fail(b, 3)
    clock.now += 5
    assert b.allow()
    b.failure()
    assert b.state is BreakerState.OPEN
    clock.now += 4
    assert not b.allow()
    clock.now += 1
    assert b.allow()
    assert changes[-2:] == [("half_open", "open"), ("open", "half_open")]


def test_an_abandoned_probe_frees_its_place() -> None:
    b, clock, _ = breaker()
    fail(b, 3)
    clock.now += 5
    assert b.allow()
    b.abandon()
    assert b.allow()


def test_a_probe_that_never_reports_is_given_up_after_a_cool_down() -> None:
    b, clock, _ = breaker()
    fail(b, 3)
    clock.now += 5
    assert b.allow()
    clock.now += 4
    assert not b.allow()
    clock.now += 1
    assert b.allow() and b.state is BreakerState.HALF_OPEN


def test_a_failure_ratio_over_the_window_opens_it() -> None:
    b, clock, changes = breaker(failures=100, failure_ratio=0.5, window_s=10.0, min_calls=10)
    for _ in range(5):  # alternate: never two failures in a row
        assert b.allow()
        b.success()
        clock.now += 0.1
        fail(b, 1)
    assert b.state is BreakerState.OPEN and changes == [("closed", "open")]


def test_old_calls_leave_the_window() -> None:
    b, clock, _ = breaker(failures=100, failure_ratio=0.5, window_s=10.0, min_calls=10)
    fail(b, 4)
    b.success()
    clock.now += 11  # those five calls are forgotten
    for _ in range(4):
        b.success()
        fail(b, 1)
    assert b.state is BreakerState.CLOSED  # 8 calls: too few to trust the ratio
    b.success()
    fail(b, 1)  # 5 of 10 failed
    assert b.state is BreakerState.OPEN


def test_too_few_calls_do_not_trust_the_ratio() -> None:
    b, _, _ = breaker(failures=100, failure_ratio=0.5, min_calls=10)
    for _ in range(4):
        b.success()
        fail(b, 1)
    assert b.state is BreakerState.CLOSED


def test_zero_failures_turns_the_breaker_off() -> None:
    b, _, changes = breaker(failures=0)
    fail(b, 1000)
    assert b.state is BreakerState.CLOSED and b.allow() and changes == []


@given(st.lists(st.sampled_from(["ok", "fail", "tick", "abandon"]), max_size=200))
def test_an_open_breaker_refuses_every_call_until_its_cool_down_is_over(
    events: list[str],
) -> None:
    b, clock, changes = breaker(failures=2, min_calls=4)
    opened_at: float | None = None
    for event in events:
        if event == "tick":
            clock.now += 1.5
        elif event == "abandon":
            b.abandon()
        else:
            seen = len(changes)
            allowed = b.allow()
            if opened_at is not None and clock.now - opened_at < 5.0:
                assert not allowed
            if allowed:
                b.success() if event == "ok" else b.failure()
            if changes[seen:] and changes[-1][1] == "open":
                opened_at = clock.now
            elif changes[seen:]:
                opened_at = None
    # Every change is a real change, along the four legal edges.
    assert set(changes) <= {("closed", "open"), ("open", "half_open"),
                            ("half_open", "closed"), ("half_open", "open")}


def test_the_ratio_is_over_a_bounded_number_of_recent_calls() -> None:
    b, _, _ = breaker(failures=10**9, failure_ratio=0.5, window_s=60.0, min_calls=10)
    for _ in range(15_000):
        b.success()
    for _ in range(4_999):
        fail(b, 1)
    assert b.state is BreakerState.CLOSED
    fail(b, 1)  # half of the last 10,000 calls failed
    assert b.state is BreakerState.OPEN
