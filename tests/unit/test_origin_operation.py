"""The one retry driver of the origin: attempts under the breaker, the deadline,
the retry decision and the metrics, with scripted attempts (no I/O)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

import pytest
from botocore.exceptions import ParamValidationError
from prometheus_client import CollectorRegistry

from sidecar.errors import (
    ObjectNotFound,
    OriginCircuitOpen,
    OriginRequestRefused,
    OriginThrottled,
    OriginUnavailable,
)
from sidecar.origin.breaker import BreakerSettings, BreakerState, CircuitBreaker
from sidecar.origin.client import judge
from sidecar.origin.http1 import ResponseHead
from sidecar.origin.operation import Operation, Rules
from sidecar.origin.range_reader import OriginAnswered, SinkFailed
from sidecar.telemetry.metrics import Metrics
from tests.support.clock import FakeClock


class Answered(OriginAnswered):
    def __init__(self, status: int, code: str) -> None:
        super().__init__(status, code, ResponseHead(status, "", {}))


def rules(retries: int = 3, failures: int = 3) -> tuple[Rules, CircuitBreaker, Metrics]:
    clock = FakeClock(1000.0)
    breaker = CircuitBreaker(BreakerSettings(failures=failures, cool_down_s=5.0), clock)
    metrics = Metrics(CollectorRegistry())
    # jitter 0: retries do not sleep, the tests stay quick and exact.
    return Rules(breaker, metrics, clock, lambda: 0.0, retries, 10.0, judge), breaker, metrics


def requests(metrics: Metrics, outcome: str) -> float:
    return metrics.value("sidecar_origin_requests_total", {"lane": "foreground",
                                                           "outcome": outcome})


async def run(operation: Operation, outcomes: list[Exception | None]) -> int:
    """Attempts until one succeeds; each raises its scripted outcome. The attempts made."""
    made = 0
    while True:
        async with operation.attempt():
            made += 1
            outcome = outcomes[made - 1]
            if outcome is not None:
                raise outcome
            return made


async def test_a_retryable_answer_is_tried_again_and_counted() -> None:
    rule, breaker, metrics = rules()
    operation = Operation(rule, "foreground", "HEAD s3://b/k", "b", "k")
    assert await run(operation, [Answered(503, "InternalError"), None]) == 2
    assert (requests(metrics, "error"), requests(metrics, "ok")) == (1, 1)
    assert breaker.consecutive_failures == 0  # the success after it reset the count


async def test_a_final_answer_is_translated_at_once_and_is_no_failure_of_the_origin() -> None:
    rule, breaker, metrics = rules()
    operation = Operation(rule, "foreground", "HEAD s3://b/k", "b", "k")
    with pytest.raises(ObjectNotFound):
        await run(operation, [Answered(404, "NoSuchKey"), None])
    assert requests(metrics, "not_found") == 1
    assert breaker.consecutive_failures == 0 and breaker.state is BreakerState.CLOSED


async def test_retries_end_with_the_origins_last_word() -> None:
    rule, _, _ = rules(retries=2, failures=0)
    operation = Operation(rule, "foreground", "GET s3://b/k", "b", "k")
    with pytest.raises(OriginThrottled, match="3 attempts failed; last: 503 SlowDown"):
        await run(operation, [Answered(503, "SlowDown")] * 3)
    operation = Operation(rule, "foreground", "GET s3://b/k", "b", "k")
    with pytest.raises(OriginUnavailable, match="ConnectionResetError") as caught:
        await run(operation, [ConnectionResetError("reset")] * 3)
    assert not isinstance(caught.value, OriginThrottled)


async def test_progress_renews_the_deadline_and_the_attempt_count() -> None:
    rule, _, _ = rules(retries=1, failures=0)
    operation = Operation(rule, "foreground", "GET s3://b/k", "b", "k")
    broken = 0
    while broken < 5:  # five breaks, each after some bytes: never given up on
        async with operation.attempt() as attempt:
            attempt.progressed()
            broken += 1
            raise ConnectionResetError("mid-body")
    assert operation.attempts.failed == 1


async def test_an_open_breaker_refuses_at_once() -> None:
    rule, breaker, metrics = rules(retries=0, failures=1)
    with pytest.raises(OriginUnavailable):
        await run(Operation(rule, "foreground", "GET s3://b/k", "b", "k"),
                  [Answered(500, "InternalError")])
    assert breaker.state is BreakerState.OPEN
    with pytest.raises(OriginCircuitOpen):
        await run(Operation(rule, "foreground", "GET s3://b/k", "b", "k"), [None])
    assert metrics.value("sidecar_origin_breaker_rejected_total") == 1


async def test_a_failing_sink_is_not_the_origins_fault() -> None:
    rule, breaker, metrics = rules(failures=1)
    operation = Operation(rule, "foreground", "GET s3://b/k", "b", "k")
    disk_full = OSError(28, "No space left on device")
    failed = SinkFailed("disk")
    failed.__cause__ = disk_full
    with pytest.raises(OSError) as caught:
        await run(operation, [failed])
    assert caught.value is disk_full
    assert breaker.state is BreakerState.CLOSED and requests(metrics, "error") == 0
    # The origin answered: its request is counted, and timed, as any other.
    assert requests(metrics, "ok") == 1
    assert metrics.value("sidecar_origin_request_duration_seconds_count",
                         {"lane": "foreground"}) == 1


async def test_a_cancelled_attempt_gives_no_verdict() -> None:
    rule, breaker, _ = rules(failures=1)
    operation = Operation(rule, "foreground", "GET s3://b/k", "b", "k")
    started = asyncio.Event()

    async def slow() -> None:
        async with operation.attempt():
            started.set()
            await asyncio.sleep(60)

    task = asyncio.ensure_future(slow())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert breaker.state is BreakerState.CLOSED and breaker.consecutive_failures == 0


async def test_an_answered_attempt_its_reader_left_is_counted_once() -> None:
    """Bytes came, then the reader went away (GeneratorExit at a yield, or a
    cancel): the origin answered that request, so it is counted, once, as
    ok; an attempt left before any byte came has no answer to count."""
    rule, _, metrics = rules()
    operation = Operation(rule, "foreground", "GET s3://b/k", "b", "k")

    async def chunks() -> AsyncIterator[bytes]:
        async with operation.attempt() as attempt:
            attempt.progressed()
            yield b"first"
            yield b"second"

    async with aclosing(chunks()) as reading:
        async for _ in reading:
            break  # the reader leaves after its first chunk
    assert requests(metrics, "ok") == 1 and requests(metrics, "error") == 0
    assert metrics.value("sidecar_origin_request_duration_seconds_count",
                         {"lane": "foreground"}) == 1

    unanswered = Operation(rule, "foreground", "GET s3://b/k", "b", "k")
    started = asyncio.Event()

    async def waiting() -> None:
        async with unanswered.attempt():
            started.set()
            await asyncio.sleep(60)

    task = asyncio.ensure_future(waiting())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert requests(metrics, "ok") == 1 and requests(metrics, "error") == 0


async def test_a_request_the_client_would_not_send_is_no_word_on_the_origin() -> None:
    rule, breaker, _ = rules(retries=3, failures=1)
    refused = ParamValidationError(report='Invalid bucket name "not a bucket": Bucket name '
                                          'must match the regex "^[a-zA-Z0-9.\\-_]{1,255}$"')
    operation = Operation(rule, "foreground", "HEAD s3://not a bucket", "not a bucket", "")
    with pytest.raises(OriginRequestRefused,
                       match=r'^s3://not a bucket/: Invalid bucket name "not a bucket"$'):
        await run(operation, [refused, None])  # not tried again
    assert breaker.state is BreakerState.CLOSED and breaker.consecutive_failures == 0
    # Half-open, it is no probe's success either: the breaker stays as it was,
    # and the next call may probe.
    with pytest.raises(OriginUnavailable):
        await run(Operation(rule, "foreground", "GET s3://b/k", "b", "k"),
                  [ConnectionResetError("reset")] * 4)
    assert breaker.state is BreakerState.OPEN
    rule.clock.advance(6.0)  # type: ignore[attr-defined]
    with pytest.raises(OriginRequestRefused):
        await run(Operation(rule, "foreground", "HEAD s3://not a bucket", "not a bucket", ""),
                  [refused])
    assert breaker.state is BreakerState.HALF_OPEN
    assert await run(Operation(rule, "foreground", "GET s3://b/k", "b", "k"), [None]) == 1
    assert breaker.state is BreakerState.CLOSED
