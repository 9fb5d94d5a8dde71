"""Judging what the soak saw: an answer against the truth, and the sidecar's
memory and fds over time. Pure: no clock, no I/O (tests/unit/test_soak.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# How an answer's body ended: all that was promised came ("whole"), the reader
# stopped on purpose (a Kafka fetch takes ~1 MiB of an open-ended range), or
# the connection ended early ("cut": a reset, a kill, an aborted stream).
Ending = Literal["whole", "stopped", "cut"]


@dataclass(frozen=True)
class Verdict:
    outcome: str  # "ok", "cut", "wrong" (bytes), "wrong_status" (404 for an object, ...)
    bytes_verified: int
    wrong_bytes: int


def verify(candidates: Sequence[bytes | None], status: int, first: int, last: int | None,
           body: bytes, ending: Ending) -> Verdict:
    """A 200, 206 or 404 answer to `bytes=first-last` (last None: open-ended)
    against what the object may be: one version, or any of a few (an object
    rewritten meanwhile; None: no such object). The whole answer must equal the
    same range of ONE candidate, never a mix of two; a body that stopped or was
    cut must be a prefix of that range. Errors (503, 403, ...) are not judged here.
    """
    versions = [c for c in candidates if c is not None]
    if status == 404:
        return Verdict("ok" if None in candidates else "wrong_status", 0, 0)
    if status == 200:  # the whole object: S3's answer to a range it cannot take
        first, last = 0, None
    if not versions:  # a deleted object served: every byte is stale
        return Verdict("wrong", len(body), max(1, len(body)))
    wrong = min(_mismatches(version[first:None if last is None else last + 1], body, ending)
                for version in versions)
    if wrong:
        return Verdict("wrong", len(body), wrong)
    return Verdict("cut" if ending == "cut" else "ok", len(body), 0)


def _mismatches(expected: bytes, body: bytes, ending: Ending) -> int:
    if body == (expected if ending == "whole" else expected[:len(body)]):
        return 0
    # Bytes that differ where both go, plus those the body has too many or, when
    # it claims to be whole, too few; at least one, since they are not equal.
    differing = sum(a != b for a, b in zip(body, expected, strict=False))
    surplus = len(body) - len(expected)
    return max(1, differing + (abs(surplus) if ending == "whole" else max(0, surplus)))


@dataclass(frozen=True)
class Growth:
    first_window_peak: int
    last_window_peak: int
    limit: int
    grew: bool


def growth(samples: Sequence[tuple[float, int]], duration_s: float, ratio: float,
           slack: int) -> Growth:
    """Whether a quantity (RSS, open fds) sampled as (seconds, value) grew without
    bound. The rule: after a warm-up (a sixth of the run, at most a minute), the
    peak of the first window must bound the peak of the last one (each a quarter
    of the run, at most 5 minutes): last <= first * ratio + slack. A leak shows
    as a last window above that; the ups and downs of load and restarts do not.
    """
    warm_up = min(60.0, duration_s / 6)
    window = min(300.0, duration_s / 4)
    first = [v for t, v in samples if warm_up <= t < warm_up + window]
    last = [v for t, v in samples if t >= duration_s - window]
    first_peak = max(first, default=0)
    last_peak = max(last, default=0)
    limit = int(first_peak * ratio) + slack
    return Growth(first_peak, last_peak, limit, bool(first) and last_peak > limit)
