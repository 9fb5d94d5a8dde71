"""What a client's requests to an S3 endpoint looked like, from an access log.

Pure: access-log lines in, a summary out. Two line formats are read:

- the sidecar's JSON lines (`SIDECAR_ACCESS_LOG`, sidecar/telemetry/access_log.py):
  what a broker's remote storage manager asked of the sidecar;
- the origin emulator's `bench` lines (bench/nginx.py: method, uri, status, body
  bytes, seconds, "Range", connection serial, requests on it so far): what reached
  the origin, from the manager itself or from the sidecar.

A summary says how many requests of each kind of object there were (Aiven's
layout: `.rsm-manifest`, `.indexes`, `.log`), how their ranges were written
(closed `bytes=a-b`, open `bytes=a-`, suffix `bytes=-n`, or none), how large
the GETs were (the closed range's length, else the bytes sent) as quantiles and
a histogram, and how many requests went over each connection.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

KiB = 1024
MiB = 1024 * KiB
#: Kinds of object by key suffix (Aiven's layout); anything else is "other".
KINDS = ("rsm-manifest", "indexes", "log")
#: Upper bounds of the size histogram's bins (bytes), the last one open.
SIZE_BINS: tuple[tuple[int | None, str], ...] = (
    (64 * KiB, "<= 64 KiB"), (1 * MiB, "<= 1 MiB"), (4 * MiB, "<= 4 MiB"),
    (8 * MiB, "<= 8 MiB"), (16 * MiB, "<= 16 MiB"), (None, "> 16 MiB"))

_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
_ORIGIN_LINE = re.compile(
    r'^(?P<method>\S+) (?P<uri>\S+) (?P<status>\d+) (?P<sent>\d+) \S+ "(?P<range>[^"]*)"'
    r"(?: (?P<connection>\d+) (?P<on_connection>\d+))?$")


@dataclass(frozen=True)
class Request:
    method: str
    key: str
    range: str | None  # the Range header as sent
    status: int
    sent: int  # body bytes sent
    connection: int | None = None  # the server's serial number of its connection

    @property
    def kind(self) -> str:
        suffix = self.key.rpartition(".")[2] if "." in self.key else ""
        return suffix if suffix in KINDS else "other"

    @property
    def range_form(self) -> str:
        match = _RANGE.match(self.range or "")
        if not self.range:
            return "none"
        if match is None:
            return "other"
        first, last = match.groups()
        if not first:
            return "suffix"
        return "closed" if last else "open"

    @property
    def asked(self) -> int:
        """The bytes asked for: a closed range's length, else what was sent."""
        match = _RANGE.match(self.range or "")
        if match is not None and match.group(1) and match.group(2):
            return int(match.group(2)) - int(match.group(1)) + 1
        return self.sent


def sidecar_requests(lines: Iterable[str]) -> list[Request]:
    """The object requests of sidecar access-log lines (others, and lines that are not
    JSON objects, are skipped)."""
    found = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if not isinstance(entry, dict) or not entry.get("key"):
            continue
        if entry.get("method") == "FETCH":
            continue  # the sidecar's own read-ahead or warm fetch, not a client's request
        found.append(Request(str(entry.get("method")), str(entry["key"]), entry.get("range"),
                             int(entry.get("status") or 0), int(entry.get("bytes") or 0)))
    return found


def origin_requests(lines: Iterable[str], bucket: str) -> list[Request]:
    """The object requests (`/{bucket}/{key}`) of origin emulator access-log lines."""
    found = []
    prefix = f"/{bucket}/"
    for line in lines:
        match = _ORIGIN_LINE.match(line.strip())
        if match is None or not match["uri"].startswith(prefix):
            continue
        key = match["uri"][len(prefix):]
        if not key:
            continue
        connection = match["connection"]
        found.append(Request(match["method"], key,
                             None if match["range"] in ("", "-") else match["range"],
                             int(match["status"]), int(match["sent"]),
                             int(connection) if connection else None))
    return found


def quantile(ordered: Sequence[int], fraction: float) -> int | None:
    """The nearest-rank quantile of sorted values; None for none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(round(fraction * len(ordered), 9)))
    return ordered[min(len(ordered), rank) - 1]


def summarize(requests: Sequence[Request], connections: int | None = None) -> dict[str, Any]:
    """The pattern of `requests`. `connections`: how many connections they came over,
    when the log cannot tell (else the distinct connection serials in it)."""
    gets = [request for request in requests if request.method == "GET"]
    sizes = sorted(request.asked for request in gets if request.status in (200, 206))
    histogram = Counter(_bin(size) for size in sizes)
    serials = {request.connection for request in requests if request.connection is not None}
    if connections is None and serials:
        connections = len(serials)
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in (*KINDS, "other"):
        mine = [request for request in gets if request.kind == kind]
        if mine or kind in KINDS:
            by_kind[kind] = {
                "gets": len(mine),
                "share": len(mine) / len(gets) if gets else None,
                "bytes": sum(request.sent for request in mine),
                "ranges": dict(Counter(request.range_form for request in mine)),
                "asked_p50": quantile(sorted(request.asked for request in mine), 0.5),
            }
    return {
        "requests": len(requests),
        "methods": dict(Counter(request.method for request in requests)),
        "statuses": {str(code): count for code, count in
                     sorted(Counter(request.status for request in requests).items())},
        "gets": len(gets),
        "bytes": sum(request.sent for request in gets),
        "by_kind": by_kind,
        "ranges": dict(Counter(request.range_form for request in gets)),
        "sizes": {"p10": quantile(sizes, 0.1), "p50": quantile(sizes, 0.5),
                  "p90": quantile(sizes, 0.9), "max": sizes[-1] if sizes else None,
                  "mean": sum(sizes) / len(sizes) if sizes else None},
        "histogram": {label: histogram.get(label, 0) for _, label in SIZE_BINS},
        "connections": connections,
        "requests_per_connection": len(requests) / connections if connections else None,
    }


def _bin(size: int) -> str:
    for bound, label in SIZE_BINS:
        if bound is None or size <= bound:
            return label
    return SIZE_BINS[-1][1]
