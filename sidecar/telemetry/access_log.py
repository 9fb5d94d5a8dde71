"""The optional JSON-lines access log of the data port (`access_log = PATH | "-"`).

One line per request, for offline analysis (hit rates per topic, hot keys,
read patterns) that the metrics cannot carry because their labels must stay
bounded:

    {"time": "2026-11-01T06:00:00.123Z", "request_id": "9F3C...", "method": "GET",
     "bucket": "tiered", "key": "orders-Ab3/0/00000000000000000000-x.log",
     "range": "bytes=0-", "status": 206, "bytes": 1048576, "cache": "hit",
     "duration_s": 0.0012}

`range` is the Range header as the client sent it (null without one); `bytes` the
object bytes sent (0 for HEAD and errors); `cache` is hit, partial or miss for a
body served from the cache, from both, or from the origin, and none for answers
without object data. A line is built on the event loop and written by a
background thread (logging's QueueListener), so a slow log disk never stalls
serving; lines are appended, so logrotate's copytruncate is the way to rotate.
"""

from __future__ import annotations

import json
import logging
import logging.handlers
import queue
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from urllib.parse import unquote

from sidecar.s3.http_fields import as_sent

# The key a request's handler adds the object bytes it sent to (request[BODY_BYTES]).
BODY_BYTES = "sidecar_body_bytes"


@dataclass(frozen=True)
class AccessEntry:
    time: str
    request_id: str
    method: str
    bucket: str
    key: str
    range: str | None
    status: int
    bytes: int
    cache: str
    duration_s: float


def entry(
    *, now: float, request_id: str, method: str, raw_path: str, range_header: str | None,
    status: int, body_bytes: int, cache: str, duration_s: float,
) -> AccessEntry:
    """What one request did. Pure: the caller hands in the clock and the request's facts."""
    path = raw_path.partition("?")[0]
    bucket, _, key = path.lstrip("/").partition("/")
    stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
    return AccessEntry(
        time=stamp.replace("+00:00", "Z"), request_id=request_id, method=method,
        # A malformed escape is logged as sent rather than dropped.
        bucket=unquote(bucket, errors="replace"), key=unquote(key, errors="replace"),
        range=None if range_header is None else as_sent(range_header),
        status=status, bytes=body_bytes, cache=cache,
        duration_s=round(duration_s, 6),
    )


def format_entry(item: AccessEntry) -> str:
    """One JSON object on one line (json.dumps escapes any newline in a key)."""
    return json.dumps(asdict(item), separators=(",", ":"), ensure_ascii=False)


class AccessLog:
    """Writes entries to `target` ("-" for stdout, else a file appended to)."""

    def __init__(self, target: str) -> None:
        handler: logging.Handler = (
            logging.StreamHandler(sys.stdout) if target == "-"
            else logging.FileHandler(target, encoding="utf-8", delay=False)
        )
        handler.setFormatter(logging.Formatter("%(message)s"))
        self._handler = handler
        self._queue: queue.SimpleQueue[logging.LogRecord] = queue.SimpleQueue()
        self._listener = logging.handlers.QueueListener(self._queue, handler)
        self._logger = logging.Logger("sidecar.access")  # not in the tree: never propagates
        self._logger.addHandler(logging.handlers.QueueHandler(self._queue))
        self._listener.start()

    def write(self, item: AccessEntry) -> None:
        self._logger.info(format_entry(item))

    def close(self) -> None:
        """Flush what is queued and close the file."""
        self._listener.stop()
        self._handler.close()
