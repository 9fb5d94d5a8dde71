"""Pure decisions of the origin client: when to try again, and what a good answer is.

No sockets and no clock of its own (the clock is handed in): `sidecar.origin.client`
asks these questions and does the I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

# Full jitter (AWS Architecture Blog, "Exponential Backoff And Jitter", 2015; the
# same as botocore's standard retry mode): a sleep drawn uniformly from
# [0, min(cap, base * 2**attempt)) spreads the retries of many readers of one
# failing origin instead of having them return in lock-step.
BACKOFF_BASE_S = 0.05
BACKOFF_CAP_S = 2.0
# S3 asks callers that got SlowDown to back off harder than after a 500
# (S3 User Guide, "Best practices design patterns: optimizing performance").
THROTTLED_BASE_S = 0.2

# S3 error codes that mean "the same request may succeed later"
# (S3 API Reference, "Error responses"; botocore's standard retry mode list).
RETRYABLE_CODES = frozenset({
    "InternalError", "ServiceUnavailable", "SlowDown", "Throttling", "ThrottlingException",
    "RequestTimeout", "RequestTimeTooSkewed", "RequestLimitExceeded", "BandwidthLimitExceeded",
    "TooManyRequests", "EC2ThrottledException", "TransactionInProgressException",
})
THROTTLING_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "TooManyRequests", "EC2ThrottledException",
})


# Statuses that mean "the same request may succeed later", as botocore's
# standard retry mode has them: not every 5xx (S3's 501 NotImplemented says a
# header or feature of the request is not implemented, and answers every
# attempt alike; retrying it would spend the deadline and open the breaker).
RETRYABLE_STATUSES = frozenset({429, 500, 502, 503, 504})


def is_retryable_answer(status: int, code: str) -> bool:
    """Whether an HTTP error answer of the origin is worth another try."""
    return status in RETRYABLE_STATUSES or code in RETRYABLE_CODES


def is_throttling(status: int, code: str) -> bool:
    return status == 429 or code in THROTTLING_CODES


def backoff_s(attempt: int, jitter: float, throttled: bool = False) -> float:
    """Sleep before retry number `attempt` (1-based); `jitter` is uniform in [0, 1)."""
    base = THROTTLED_BASE_S if throttled else BACKOFF_BASE_S
    return jitter * min(BACKOFF_CAP_S, base * 2.0 ** attempt)


@dataclass(frozen=True)
class Retry:
    """Try again after this long."""

    delay_s: float


@dataclass(frozen=True)
class GiveUp:
    """Stop: the client is told SlowDown when `throttled`, else the origin is unavailable."""

    throttled: bool
    why: str


@dataclass
class Attempts:
    """The failed attempts of one origin operation, and what to do after one.

    A ranged GET that receives bytes makes progress (`progressed`): the count
    starts again, so a long read that keeps moving is not given up on for
    breaking off more often than `retries` times in all. `throttled` remembers
    whether the origin's last answer was SlowDown (or 429): a break of the
    connection after it does not make the client's answer any less a SlowDown.
    """

    retries: int
    failed: int = 0
    throttled: bool = False

    def progressed(self) -> None:
        self.failed = 0

    def after_failure(
        self, throttling: bool | None, remaining_s: float, deadline_s: float, jitter: float
    ) -> Retry | GiveUp:
        """One more attempt failed; `throttling` None: it got no answer at all.
        `jitter` is uniform in [0, 1)."""
        self.failed += 1
        if throttling is not None:
            self.throttled = throttling
        delay = backoff_s(self.failed, jitter, self.throttled)
        if self.failed > self.retries:
            return GiveUp(self.throttled, f"{self.failed} attempts failed")
        if delay >= remaining_s:
            return GiveUp(self.throttled, f"no answer within the {deadline_s:g}s deadline")
        return Retry(delay)


class Deadline:
    """The time an origin operation may still take, retries and resumes included.

    A ranged GET renews it whenever bytes arrive (`progress`): the deadline
    bounds how long a read goes without progress, so a stalled or failing
    origin is given up on in bounded time, while a large read that keeps
    moving is not cut off for being large.
    """

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self._seconds = seconds
        self._clock = clock
        self._until = clock() + seconds

    @property
    def seconds(self) -> float:
        return self._seconds

    def remaining(self) -> float:
        return max(0.0, self._until - self._clock())

    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def allows_sleep(self, seconds: float) -> bool:
        """Whether sleeping `seconds` still leaves time for another attempt."""
        return seconds < self.remaining()

    def progress(self) -> None:
        self._until = self._clock() + self._seconds

    def extend(self, seconds: float) -> None:
        """Time spent waiting on something else than the origin does not count."""
        self._until += seconds


def range_answer_problem(
    content_range: str | None, content_length: int | None, start: int, end: int, size: int
) -> str | None:
    """What is wrong with an answer to `Range: bytes=start-(end-1)`, or None.

    RFC 9110 section 14.4: a 206 carries `Content-Range: bytes first-last/complete`
    and section 8.6: Content-Length is the length of the content sent. A range
    that is not the one asked (a 200 with the whole object, another range, a
    body of another length) must not fill blocks: it would cache the wrong bytes
    under the right offsets. A missing Content-Length is accepted (the body is
    then checked byte by byte as it arrives); a missing Content-Range only when
    the whole object was asked for (S3 answers such a range with 206 anyway).
    """
    expected = end - start
    if content_length is not None and content_length != expected:
        return f"body of {content_length} bytes for a range of {expected}"
    if content_range is None:
        if start == 0 and end == size:
            return None
        return "no Content-Range in the answer to a range request"
    unit, _, rest = content_range.strip().partition(" ")
    span, _, complete = rest.partition("/")
    first, _, last = span.partition("-")
    if unit != "bytes" or not _is_digits(first) or not _is_digits(last) \
            or not (complete == "*" or _is_digits(complete)):
        return f"unreadable Content-Range {content_range!r}"
    if (int(first), int(last)) != (start, end - 1):
        return f"Content-Range {content_range!r} for a request of bytes={start}-{end - 1}"
    if complete != "*" and int(complete) != size:
        return f"Content-Range {content_range!r}: the object is no longer {size} bytes"
    return None


def _is_digits(text: str) -> bool:
    """RFC 9110's 1*DIGIT: ASCII digits only. Header fields are read as latin-1,
    where superscripts such as "\xb2" pass str.isdigit() and then fail int()."""
    return text.isascii() and text.isdigit()
