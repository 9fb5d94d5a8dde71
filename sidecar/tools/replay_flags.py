"""`sidecar replay`'s flags: the values checked before anything is contacted.

Each check raises ConfigError naming the flag, so a bad value is one line and
exit 2, never a request to an endpoint that then fails for another reason.
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

from sidecar.errors import ConfigError

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Each request's connect and read timeout unless --timeout says otherwise:
# botocore's own 60 s read timeout, tried 4 times (retries max_attempts 3 counts
# the retries), left an operator waiting four minutes on an endpoint that accepts
# the connection and never answers.
DEFAULT_TIMEOUT_S = 10.0


# What botocore lets through as a bucket name (S3's own rules are narrower, but
# other object stores take upper case and '_'): anything else fails before a
# request is sent.
_BUCKET_NAME = re.compile(r"[a-zA-Z0-9.\-_]{1,255}")


def check_bucket(name: str) -> str:
    """The name, if a bucket can have it; ConfigError otherwise."""
    if not _BUCKET_NAME.fullmatch(name):
        raise ConfigError("--bucket: expected a bucket name (letters, digits, '.', '-', '_'; "
                          f"at most 255), got {name[:80]!r}")
    return name


def parse_partitions(text: str) -> frozenset[int] | None:
    """`all` -> None; `0,1` -> {0, 1}."""
    if text.strip().lower() == "all":
        return None
    parts = [part.strip() for part in text.split(",")]
    if not parts or not all(part.isdigit() for part in parts):
        raise ConfigError(f"--partitions: expected 'all' or a list like 0,1, got {text!r}")
    return frozenset(int(part) for part in parts)


def parse_moment(text: str, flag: str) -> int:
    """Epoch milliseconds from an ISO 8601 time with a zone, or from epoch ms."""
    if text.strip().isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        raise ConfigError(f"{flag}: expected an ISO 8601 time with a zone "
                          f"(e.g. 2026-11-01T00:00:00Z) or epoch ms, got {text!r}")
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def parse_range(kind: str, first: int | str | None, last: int | str | None
                ) -> tuple[int, int | None] | None:
    """--from-KIND/--to-KIND as an inclusive range; None when neither is given."""
    if first is None and last is None:
        return None

    def value(given: int | str, flag: str) -> int:
        if isinstance(given, str):
            return parse_moment(given, flag)
        if given < 0:
            raise ConfigError(f"{flag} must be 0 or more, got {given}")
        return given

    start = 0 if first is None else value(first, f"--from-{kind}")
    end = None if last is None else value(last, f"--to-{kind}")
    if end is not None and end < start:
        raise ConfigError(f"--to-{kind} is before --from-{kind}")
    return start, end


def check_progress(seconds: float) -> float:
    """--progress: 0 (no progress lines) or a finite number of seconds. float()
    takes "nan", which compares false both ways: it passed as a silent 0."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"--progress must be 0 or more seconds, got {seconds:g}")
    return seconds


def check_timeout(seconds: float) -> float:
    """--timeout: a positive, finite number of seconds."""
    if not math.isfinite(seconds) or seconds <= 0:
        raise ConfigError(f"--timeout must be a positive number of seconds, got {seconds:g}")
    return seconds
