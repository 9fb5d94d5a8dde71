"""One origin operation and its attempts: the one retry driver of the origin.

Every call to the object store (HEAD, LIST, a ranged GET streamed to a bypass
reader, a block fetch read by a worker thread) is an `Operation`; each try of
it is `async with operation.attempt() as attempt:` around the I/O. The attempt:

- is admitted by the circuit breaker, or refused at once while it is open;
- on success is counted (`sidecar_origin_requests_total`, duration) and tells
  the breaker so;
- on failure is judged (`Rules.judge`: the library's exception translated into
  the sidecar's errors, retryable or not, throttling or not), counted and told
  to the breaker (a retryable failure counts against the origin, a 404, 403 or
  412 is a healthy origin's answer), and then either raises the translated
  error, or asks the pure decision (`policy.Attempts.after_failure`) and sleeps
  before the next attempt (the failure is swallowed: the caller loops), or
  gives up with OriginThrottled or OriginUnavailable;
- `attempt.progressed()` (bytes arrived) renews the deadline, restarts the
  attempt count and tells the breaker the origin is answering;
- a cancelled attempt (the reader went away) gives the breaker no verdict;
  it is counted ("ok") when bytes had come: the origin answered it;
- an attempt whose bytes the cache disk refused (SinkFailed) is counted "ok"
  and raises the disk's error: nobody's fault at the origin.

A caller reads:

    operation = origin.operation(lane, "GET s3://b/k", "b", "k")
    while not done:
        async with operation.attempt() as attempt:
            ...  # one try; attempt.progressed() as bytes come
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TypeVar

from sidecar.errors import (
    BucketNotFound,
    ObjectNotFound,
    OriginCircuitOpen,
    OriginError,
    OriginRequestRefused,
    OriginThrottled,
    OriginUnavailable,
)
from sidecar.origin.breaker import CircuitBreaker
from sidecar.origin.policy import Attempts, Deadline, GiveUp
from sidecar.origin.range_reader import SinkFailed
from sidecar.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Verdict:
    """What one failed attempt means. `error`: raise this now (None: retry if the
    policy allows); `retryable`: the origin is to blame (the breaker counts it);
    `throttling`: the origin said SlowDown (None: it said nothing at all)."""

    error: OriginError | None
    retryable: bool
    throttling: bool | None
    described: str


@dataclass(frozen=True)
class Rules:
    """What every operation of one origin shares."""

    breaker: CircuitBreaker
    metrics: Metrics
    clock: Callable[[], float]
    jitter: Callable[[], float]
    retries: int
    deadline_s: float
    judge: Callable[[Exception, str, str], Verdict]


class Attempt:
    """One try of an operation; `progressed` when bytes arrive."""

    def __init__(self, operation: Operation) -> None:
        self._operation = operation
        self.judged = False  # the breaker has heard from this attempt

    def progressed(self) -> None:
        operation = self._operation
        operation.deadline.progress()
        operation.attempts.progressed()
        if not self.judged:
            self.judged = True
            if operation.use_breaker:
                operation.rules.breaker.success()  # the origin is answering with bytes


class Operation:
    def __init__(
        self, rules: Rules, lane: str, what: str, bucket: str, key: str,
        use_breaker: bool = True,
    ) -> None:
        self.rules = rules
        self.lane = lane
        self.what = what
        self.bucket = bucket
        self.key = key
        self.use_breaker = use_breaker
        self.deadline = Deadline(rules.deadline_s, rules.clock)
        self.attempts = Attempts(rules.retries)

    @asynccontextmanager
    async def attempt(self) -> AsyncIterator[Attempt]:
        rules = self.rules
        if self.use_breaker and not rules.breaker.allow():
            rules.metrics.origin_breaker_rejected.inc()
            raise OriginCircuitOpen(f"{self.what}: the origin is failing (circuit breaker open)")
        attempt = Attempt(self)
        started = rules.clock()
        try:
            yield attempt
        except SinkFailed as exc:
            # The origin did its part (its answer is counted, as any it sent);
            # the cache disk did not take the bytes.
            self._count(None, started)
            if self.use_breaker and not attempt.judged:
                rules.breaker.abandon()
            raise (exc.__cause__ or exc) from None
        except Exception as exc:
            verdict = rules.judge(exc, self.bucket, self.key)
            self._count(verdict.error if verdict.error is not None else exc, started)
            if self.use_breaker and not attempt.judged and \
                    isinstance(verdict.error, OriginRequestRefused):
                rules.breaker.abandon()  # never sent: no word on the origin either way
            elif self.use_breaker:
                if verdict.retryable:
                    rules.breaker.failure()  # a body that broke off is a failure too
                elif not attempt.judged:
                    rules.breaker.success()  # 404, 403, 412: a healthy origin's answers
            attempt.judged = True
            if verdict.error is not None:
                raise verdict.error from exc
            decision = self.attempts.after_failure(
                verdict.throttling, self.deadline.remaining(), self.deadline.seconds,
                rules.jitter())
            if isinstance(decision, GiveUp):
                kind = OriginThrottled if decision.throttled else OriginUnavailable
                raise kind(f"{self.what}: {decision.why}; last: {verdict.described}") from exc
            log.debug("%s: retry %d in %.2fs after %s", self.what, self.attempts.failed,
                      decision.delay_s, verdict.described)
            await asyncio.sleep(decision.delay_s)
        except BaseException:
            # Cancelled, or the reader went away: no verdict on the origin.
            if self.use_breaker and not attempt.judged:
                rules.breaker.abandon()
            if attempt.judged:
                # Bytes had come: a request the origin answered (and bills),
                # left by its reader, as a Kafka reader leaves a bypass read.
                self._count(None, started)
            raise
        else:
            self._count(None, started)
            if self.use_breaker and not attempt.judged:
                rules.breaker.success()

    def _count(self, error: BaseException | None, started: float) -> None:
        outcome = "ok"
        if isinstance(error, ObjectNotFound | BucketNotFound):
            outcome = "not_found"
        elif error is not None:
            outcome = "error"
        metrics = self.rules.metrics
        metrics.origin_requests.labels(self.lane, outcome).inc()
        metrics.origin_duration.labels(self.lane).observe(self.rules.clock() - started)


async def within(deadline: Deadline, stall_s: float, call: Callable[[], Awaitable[T]]) -> T:
    """`call()`, given up on after the stall limit or at the deadline."""
    remaining = deadline.remaining()
    if remaining <= 0:
        raise TimeoutError("the origin deadline has passed")
    async with asyncio.timeout(min(remaining, stall_s)):
        return await call()
