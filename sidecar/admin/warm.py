"""`POST /api/v1/warm`: validate the whole call, HEAD every object, then warm.

The body (docs/ARCHITECTURE.md, "Admin port"):

    {"objects": [{"bucket": "b", "key": "k", "start": 0, "end": null}], "ttl_s": 3600}

`start`/`end` are inclusive byte offsets like an HTTP range; `end` null (or
absent) means to the end of the object, and a range reaching past the object is
clamped to it. The answer sums the engine's WarmResult over the objects.

A call is all or nothing up to the warming itself: the body is validated
completely, every bucket checked and every object HEADed before the first block
is fetched, so a typo in the 900th object costs no origin bytes. Validation is
a pure function over the parsed JSON; `warm` decides a status and a JSON body,
and `handle` turns that into a response.

The last few calls are remembered (`RecentWarmCalls`, a bounded ring) for the
stats' `warm_calls` and the table of /ui: whoever warms a cluster can see on each
node what it was asked and what it did, while it is doing it.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import astuple, dataclass, field, fields
from functools import partial
from typing import Any, Protocol, TypeVar

from aiohttp import web

from sidecar.bucket_names import bucket_name_problem, uncached_bucket_problem
from sidecar.engine import WarmResult
from sidecar.errors import (
    BucketNotFound,
    DownloadsPaused,
    ObjectNotFound,
    OriginAccessDenied,
    OriginError,
    OriginRequestRefused,
    OriginUnavailable,
)
from sidecar.model import ObjectInfo

MAX_BODY_BYTES = 1024 * 1024
MAX_OBJECTS = 1000
MAX_TTL_S = 7 * 24 * 3600
DEFAULT_TTL_S = 3600.0
# Objects HEADed / warmed at once by one call; each warm in turn holds at most
# `BLOCK_CONCURRENCY` block fetches (the warm lane bounds the origin further).
HEAD_CONCURRENCY = 16
OBJECT_CONCURRENCY = 4
BLOCK_CONCURRENCY = 4
# Warm calls remembered for the stats and /ui; the first object's name and an
# error message are cut to MAX_SHOWN_CHARS, so the ring's memory stays bounded.
RECENT_WARM_CALLS = 20
MAX_SHOWN_CHARS = 200

_TOP_FIELDS = ("objects", "ttl_s")
_OBJECT_FIELDS = ("bucket", "key", "start", "end")


class WarmRequestError(ValueError):
    """A body the call rejects (400); the message names the offending field."""


@dataclass(frozen=True)
class WarmObject:
    bucket: str
    key: str
    start: int = 0
    end: int | None = None  # inclusive; None = to the end of the object


@dataclass(frozen=True)
class WarmRequest:
    objects: tuple[WarmObject, ...]
    ttl_s: float = DEFAULT_TTL_S


def parse_warm_body(raw: bytes) -> WarmRequest:
    """The validated request in `raw`, or WarmRequestError saying what is wrong."""
    if len(raw) > MAX_BODY_BYTES:
        raise WarmRequestError(f"body: larger than {MAX_BODY_BYTES} bytes")
    try:
        # NaN and Infinity are not JSON (RFC 8259 section 6), though Python accepts them.
        document = json.loads(raw, parse_constant=_reject_constant)
    except (UnicodeDecodeError, json.JSONDecodeError, _ConstantError) as exc:
        raise WarmRequestError(f"body: not JSON: {exc}") from None
    except ValueError:
        # int()'s digit limit: a JSON integer of more than 4,300 digits.
        raise WarmRequestError("body: a number in it is too long") from None
    except RecursionError:
        # The decoder recurses once a nesting level: a megabyte of "[" is
        # deeper than the interpreter's stack allows.
        raise WarmRequestError("body: not JSON this API reads: nested too deeply") from None
    return validate_warm_request(document)


def validate_warm_request(document: object) -> WarmRequest:
    if not isinstance(document, dict):
        raise WarmRequestError("body: must be a JSON object with 'objects' and 'ttl_s'")
    _reject_unknown(document, _TOP_FIELDS, "body")
    if "objects" not in document:
        raise WarmRequestError("objects: missing (a list of {bucket, key, start, end})")
    listed = document["objects"]
    if not isinstance(listed, list):
        raise WarmRequestError(f"objects: must be a list, got {_kind(listed)}")
    if not listed:
        raise WarmRequestError("objects: must name at least one object")
    if len(listed) > MAX_OBJECTS:
        raise WarmRequestError(
            f"objects: {len(listed)} objects in one call; at most {MAX_OBJECTS} are allowed"
        )
    objects = tuple(_validate_object(item, f"objects[{i}]") for i, item in enumerate(listed))
    ttl_s = document.get("ttl_s", DEFAULT_TTL_S)
    if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not math.isfinite(ttl_s):
        raise WarmRequestError(f"ttl_s: must be a number of seconds, got {_kind(ttl_s)}")
    if not 0 < ttl_s <= MAX_TTL_S:
        raise WarmRequestError(f"ttl_s: must be > 0 and at most {MAX_TTL_S} (7 days), got {ttl_s}")
    return WarmRequest(objects, float(ttl_s))


def _validate_object(item: object, where: str) -> WarmObject:
    if not isinstance(item, dict):
        raise WarmRequestError(f"{where}: must be an object, got {_kind(item)}")
    _reject_unknown(item, _OBJECT_FIELDS, where)
    names: dict[str, str] = {}
    for name in ("bucket", "key"):
        value = item.get(name)
        if value is None:
            raise WarmRequestError(f"{where}.{name}: missing")
        if not isinstance(value, str) or not value:
            raise WarmRequestError(
                f"{where}.{name}: must be a non-empty string, got {_kind(value)}")
        if not _is_utf8(value):
            # JSON lets "\ud800" through; S3 names are UTF-8, which has no lone
            # surrogate, and the origin client fails on it as if the origin had.
            raise WarmRequestError(f"{where}.{name}: not valid Unicode (a lone surrogate)")
        names[name] = value
    # The data port's rule (sidecar.bucket_names): a name no S3 bucket can have
    # is the call's fault, told here rather than sent to the origin, whose
    # answer ("no such bucket", or a client's refusal) would not say why.
    if (problem := bucket_name_problem(names["bucket"])) is not None:
        raise WarmRequestError(f"{where}.bucket: {problem}, got {_kind(names['bucket'])}")
    # A legacy us-east-1 name past what a cache slot records would be fetched
    # and then fail to be written: refused here, by name.
    if (too_long := uncached_bucket_problem(names["bucket"])) is not None:
        raise WarmRequestError(f"{where}.bucket: {too_long}")
    start = item.get("start", 0)
    if not _is_offset(start):
        raise WarmRequestError(f"{where}.start: must be a non-negative integer, got {start!r}")
    end = item.get("end")
    if end is not None:
        if not _is_offset(end):
            raise WarmRequestError(
                f"{where}.end: must be a non-negative integer or null, got {end!r}"
            )
        if end < start:
            raise WarmRequestError(f"{where}.end: {end} is before start {start}")
    return WarmObject(names["bucket"], names["key"], start, end)


def clamp_range(start: int, end: int | None, size: int) -> tuple[int, int] | None:
    """The inclusive byte range to warm within an object of `size` bytes, or None."""
    last = size - 1 if end is None else min(end, size - 1)
    return (start, last) if start <= last else None


class WarmOrigin(Protocol):
    async def bucket_exists(self, bucket: str) -> bool: ...

    async def head(self, bucket: str, key: str) -> ObjectInfo: ...


class Warmer(Protocol):
    async def warm(
        self, info: ObjectInfo, start: int, end: int, ttl_s: float, concurrency: int = 4
    ) -> WarmResult: ...


@dataclass(frozen=True)
class WarmAnswer:
    status: int
    body: dict[str, Any]


async def warm(request: WarmRequest, origin: WarmOrigin, engine: Warmer) -> WarmAnswer:
    """Check every bucket and object, then warm them all; nothing is fetched on a 4xx."""
    try:
        for bucket in sorted({o.bucket for o in request.objects}):
            if not await origin.bucket_exists(bucket):
                return _error(400, f"no such bucket: {bucket}")
        infos = await _bounded(
            [partial(origin.head, o.bucket, o.key) for o in request.objects],
            HEAD_CONCURRENCY,
        )
    except (BucketNotFound, ObjectNotFound) as exc:
        return _error(400, _not_found_message(exc))
    except OriginRequestRefused as exc:
        return _error(400, f"the origin client cannot send this: {exc}")
    except OriginAccessDenied as exc:
        return _error(403, f"origin denied access: {exc}")
    except OriginUnavailable as exc:
        return _error(503, f"origin unavailable: {exc}")
    except OriginError as exc:
        return _error(502, f"origin error: {exc}")

    async def one(info: ObjectInfo, wanted: WarmObject) -> WarmResult:
        span = clamp_range(wanted.start, wanted.end, info.size)
        if span is None:
            return WarmResult()
        return await engine.warm(info, span[0], span[1], request.ttl_s, BLOCK_CONCURRENCY)

    try:
        results = await _bounded(
            [partial(one, i, o) for i, o in zip(infos, request.objects, strict=True)],
            OBJECT_CONCURRENCY,
        )
    except DownloadsPaused as exc:
        # cache-only or bypass, set by an operator or by a failing cache disk.
        # The mode has a field of its own: a caller tells this 503, which lasts
        # until someone changes the mode, from an origin's, which may pass.
        answer = _error(503, str(exc))
        if exc.mode is not None:
            answer.body["mode"] = exc.mode
        return answer
    total = sum(results, WarmResult())
    return WarmAnswer(200, dict(zip((f.name for f in fields(WarmResult)), astuple(total),
                                    strict=True)))


@dataclass
class WarmCall:
    """One call's summary, as the stats show it; `status` is None while it runs."""

    started: float  # wall-clock seconds
    objects: int
    first_object: str  # "bucket/key" of the first object named, "" for an unreadable body
    ttl_s: float | None
    status: int | None = None
    seconds: float | None = None
    result: dict[str, int] | None = None  # the answer of a 200
    error: str | None = None
    _began: float = field(default=0.0, repr=False)  # monotonic, for `seconds`

    def as_json(self) -> dict[str, Any]:
        return {"started": self.started, "objects": self.objects,
                "first_object": self.first_object, "ttl_s": self.ttl_s,
                "status": self.status, "seconds": self.seconds,
                "result": self.result, "error": self.error}


class RecentWarmCalls:
    """The last `capacity` warm calls, the newest first; older ones are forgotten."""

    def __init__(self, capacity: int = RECENT_WARM_CALLS,
                 wall: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self._calls: deque[WarmCall] = deque(maxlen=capacity)
        self._wall = wall
        self._monotonic = monotonic

    def begin(self, request: WarmRequest | None) -> WarmCall:
        first = request.objects[0] if request is not None else None
        call = WarmCall(
            started=self._wall(),
            objects=len(request.objects) if request is not None else 0,
            first_object=f"{first.bucket}/{first.key}"[:MAX_SHOWN_CHARS] if first else "",
            ttl_s=request.ttl_s if request is not None else None,
            _began=self._monotonic(),
        )
        self._calls.appendleft(call)
        return call

    def finish(self, call: WarmCall, answer: WarmAnswer | None) -> None:
        """Record how `call` ended; None: it was cancelled before it had an answer."""
        call.seconds = self._monotonic() - call._began
        if answer is None:
            call.error = "cancelled"
            return
        call.status = answer.status
        if answer.status == 200:
            call.result = {name: int(value) for name, value in answer.body.items()}
        else:
            call.error = str(answer.body.get("error", ""))[:MAX_SHOWN_CHARS]

    def as_json(self) -> list[dict[str, Any]]:
        return [call.as_json() for call in self._calls]


async def handle(request: web.Request, origin: WarmOrigin, engine: Warmer,
                 recent: RecentWarmCalls | None = None) -> web.Response:
    """The aiohttp side: read, decide, answer JSON; the call is remembered in
    `recent` from its start, a rejected one too."""
    parsed = await _read_request(request)
    call = None
    if recent is not None:
        call = recent.begin(parsed if isinstance(parsed, WarmRequest) else None)
    answer: WarmAnswer | None = None
    try:
        answer = await warm(parsed, origin, engine) if isinstance(parsed, WarmRequest) \
            else parsed
    finally:
        if recent is not None and call is not None:
            recent.finish(call, answer)
    return web.json_response(answer.body, status=answer.status)


async def _read_request(request: web.Request) -> WarmRequest | WarmAnswer:
    """The validated body (at most MAX_BODY_BYTES are read), or the 400 that rejects it."""
    declared = request.content_length
    if declared is not None and declared > MAX_BODY_BYTES:
        return _error(400, f"body: larger than {MAX_BODY_BYTES} bytes")
    # Read here rather than with request.read(), whose client_max_size
    # answers 413 with a text body instead of this endpoint's JSON error.
    raw = await _read_at_most(request, MAX_BODY_BYTES + 1)
    try:
        return parse_warm_body(raw)
    except WarmRequestError as exc:
        return _error(400, str(exc))


async def _read_at_most(request: web.Request, limit: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while size < limit:
        chunk = await request.content.read(limit - size)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


T = TypeVar("T")


async def _bounded(calls: list[Callable[[], Awaitable[T]]], limit: int) -> list[T]:
    """Run the calls at most `limit` at a time; results in call order, or the first error."""
    gate = asyncio.Semaphore(limit)

    async def gated(call: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await call()

    # Every call runs to its end (HEADs are cheap and cached), so no task is
    # left behind with an exception nobody retrieves.
    outcomes = await asyncio.gather(*(gated(call) for call in calls), return_exceptions=True)
    results: list[T] = []
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
        results.append(outcome)
    return results


def _not_found_message(exc: OriginError) -> str:
    # The origin's messages read "s3://b/k: no such key"; the API says it first.
    what = "bucket" if isinstance(exc, BucketNotFound) else "key"
    return f"no such {what}: {str(exc).split(': no such', 1)[0]}"


def _error(status: int, message: str) -> WarmAnswer:
    return WarmAnswer(status, {"error": message})


def _reject_unknown(document: Mapping[str, object], allowed: tuple[str, ...], where: str) -> None:
    unknown = sorted(set(document) - set(allowed))
    if unknown:
        raise WarmRequestError(
            f"{where}: unknown field {unknown[0]!r}; allowed: {', '.join(allowed)}"
        )


def _is_offset(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _kind(value: object) -> str:
    return "null" if value is None else f"{type(value).__name__} {value!r}"[:80]


class _ConstantError(ValueError):
    pass


def _reject_constant(name: str) -> object:
    raise _ConstantError(f"{name} is not a JSON number")
