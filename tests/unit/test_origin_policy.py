"""Retry delays, the deadline, and what counts as a good answer to a ranged GET."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.origin.policy import (
    BACKOFF_CAP_S,
    Attempts,
    Deadline,
    GiveUp,
    Retry,
    backoff_s,
    is_retryable_answer,
    is_throttling,
    range_answer_problem,
)
from tests.support.clock import FakeClock


@given(st.integers(1, 60), st.floats(0.0, 0.999), st.booleans())
def test_backoff_is_full_jitter_under_the_cap(attempt: int, jitter: float, slow: bool) -> None:
    delay = backoff_s(attempt, jitter, slow)
    assert 0.0 <= delay <= jitter * BACKOFF_CAP_S < BACKOFF_CAP_S


def test_throttling_backs_off_harder() -> None:
    assert backoff_s(1, 0.5, throttled=True) > backoff_s(1, 0.5)


@pytest.mark.parametrize(("status", "code", "retry", "throttled"), [
    (500, "InternalError", True, False),
    (503, "SlowDown", True, True),
    (503, "ServiceUnavailable", True, False),
    (429, "", True, True),
    (400, "RequestTimeout", True, False),
    (404, "NoSuchKey", False, False),
    (403, "AccessDenied", False, False),
    (412, "PreconditionFailed", False, False),
    (502, "", True, False),
    (504, "", True, False),
    # Not a passing state: S3's 501 NotImplemented (a header or feature the
    # origin lacks) and 505 answer every attempt alike.
    (501, "NotImplemented", False, False),
    (505, "", False, False),
])
def test_which_answers_are_tried_again(status: int, code: str, retry: bool,
                                       throttled: bool) -> None:
    assert is_retryable_answer(status, code) is retry
    assert is_throttling(status, code) is throttled


def test_the_deadline_runs_from_the_last_progress() -> None:
    clock = FakeClock(50.0)
    deadline = Deadline(10.0, clock)
    clock.now += 6
    assert deadline.remaining() == 4.0 and not deadline.expired()
    assert deadline.allows_sleep(3.9) and not deadline.allows_sleep(4.0)
    deadline.progress()
    clock.now += 9
    assert deadline.remaining() == 1.0
    deadline.extend(2.0)  # time spent in the sidecar's own bandwidth lane
    assert deadline.remaining() == 3.0
    clock.now += 3
    assert deadline.expired() and deadline.remaining() == 0.0


SIZE = 1000


@pytest.mark.parametrize(("content_range", "length", "start", "end", "problem"), [
    ("bytes 100-199/1000", 100, 100, 200, None),
    ("bytes 100-199/1000", None, 100, 200, None),  # no length: checked as bytes arrive
    (None, 1000, 0, 1000, None),  # the whole object asked for
    (None, 1000, 100, 200, "body of 1000 bytes"),  # Range ignored: a 200 with everything
    (None, None, 100, 200, "no Content-Range"),
    ("bytes 100-199/1000", 101, 100, 200, "body of 101 bytes"),  # over-long
    ("bytes 100-199/1000", 99, 100, 200, "body of 99 bytes"),
    ("bytes 0-99/1000", 100, 100, 200, "for a request of bytes=100-199"),
    ("bytes 100-199/2000", 100, 100, 200, "no longer 1000 bytes"),
    ("items 100-199/1000", 100, 100, 200, "unreadable"),
    ("bytes 100-/1000", 100, 100, 200, "unreadable"),
    # Latin-1 superscripts pass str.isdigit() but are not numbers (RFC 9110: DIGIT is ASCII).
    ("bytes 100-19\xb9/1000", 100, 100, 200, "unreadable"),
    ("bytes \xb9\xb9-199/1000", 100, 100, 200, "unreadable"),
    ("bytes 100-199/100\xb2", 100, 100, 200, "unreadable"),
])
def test_a_ranged_answer_must_be_the_range_asked(
    content_range: str | None, length: int | None, start: int, end: int, problem: str | None
) -> None:
    found = range_answer_problem(content_range, length, start, end, SIZE)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


@given(st.integers(0, SIZE - 1), st.integers(1, SIZE), st.integers(-3, 3))
def test_only_the_exact_range_passes(start: int, length: int, skew: int) -> None:
    end = min(SIZE, start + length)
    header = f"bytes {start}-{end - 1 + skew}/{SIZE}"
    found = range_answer_problem(header, end - start, start, end, SIZE)
    assert (found is None) == (skew == 0)


def test_attempts_retry_then_give_up_after_the_retry_limit() -> None:
    attempts = Attempts(retries=2)
    decisions = [attempts.after_failure(None, 100.0, 100.0, jitter=0.5) for _ in range(3)]
    assert [type(d) for d in decisions] == [Retry, Retry, GiveUp]
    assert decisions[2] == GiveUp(False, "3 attempts failed")
    assert decisions[0].delay_s < decisions[1].delay_s  # type: ignore[union-attr]


def test_attempts_give_up_when_the_sleep_would_pass_the_deadline() -> None:
    attempts = Attempts(retries=10)
    decision = attempts.after_failure(None, remaining_s=0.001, deadline_s=2.5, jitter=0.99)
    assert decision == GiveUp(False, "no answer within the 2.5s deadline")


def test_progress_starts_the_count_again() -> None:
    attempts = Attempts(retries=1)
    assert isinstance(attempts.after_failure(None, 100.0, 100.0, 0.5), Retry)
    attempts.progressed()  # bytes arrived: a long read that keeps moving goes on
    assert isinstance(attempts.after_failure(None, 100.0, 100.0, 0.5), Retry)
    assert isinstance(attempts.after_failure(None, 100.0, 100.0, 0.5), GiveUp)


def test_throttling_is_remembered_across_answerless_failures() -> None:
    attempts = Attempts(retries=5)
    attempts.after_failure(True, 100.0, 100.0, 0.5)  # SlowDown
    attempts.after_failure(None, 100.0, 100.0, 0.5)  # then the connection broke
    assert attempts.throttled
    attempts.after_failure(False, 100.0, 100.0, 0.5)  # then a 500: not throttling now
    assert not attempts.throttled


@given(st.integers(0, 8), st.lists(st.sampled_from([None, True, False]), min_size=1,
                                   max_size=20), st.floats(0.0, 0.999))
def test_attempts_never_retry_more_than_allowed(
    retries: int, answers: list[bool | None], jitter: float
) -> None:
    attempts = Attempts(retries=retries)
    retried = 0
    for answer in answers:
        decision = attempts.after_failure(answer, 1000.0, 1000.0, jitter)
        if isinstance(decision, GiveUp):
            break
        retried += 1
        assert 0.0 <= decision.delay_s < BACKOFF_CAP_S
    assert retried <= retries
