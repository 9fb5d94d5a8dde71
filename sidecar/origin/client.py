"""The object store as the rest of the sidecar sees it: HEADs (remembered,
sidecar.origin.heads), listings, ranged GETs for readers that bypass the cache
(aiobotocore), and block fetches read by worker threads straight into the
cache (sidecar.origin.range_reader), presigned here.

Every call is an operation of the one retry driver (sidecar.origin.operation):
bounded by a deadline (`origin_deadline`) that a ranged GET renews as bytes
arrive, through the circuit breaker (sidecar.origin.breaker), retried with
botocore's own full jitter (sidecar.origin.policy) and never past the
deadline. Retries are made here rather than by botocore, so that each attempt
is seen by the breaker. A stall (no byte for `origin_read_timeout` or half the
deadline, whichever is shorter) ends an attempt; a body that breaks off is
resumed from the first byte not yet taken.

A ranged GET is checked before its bytes are used: its ETag must be the one the
read was planned against (If-Match is sent, and an origin that ignores it is
caught), its Content-Range and Content-Length must be the range asked, and the
body must end exactly at the range's end; a body that runs long is an error
before its last chunk is handed out, so the block it would complete is never
cached. Every botocore, aiohttp and socket error is translated into
`sidecar.errors` here (`judge`).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import random
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    HTTPClientError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)
from cachetools import TTLCache

from sidecar.config import OriginConfig
from sidecar.errors import (
    BucketNotFound,
    ObjectNotFound,
    OriginAccessDenied,
    OriginBadBody,
    OriginError,
    OriginObjectChanged,
    OriginThrottled,
    OriginUnavailable,
)
from sidecar.isolation.lanes import LaneLimiter
from sidecar.model import FOREGROUND, PREFETCH, WARM, ObjectInfo
from sidecar.origin.breaker import BreakerSettings, BreakerState, CircuitBreaker
from sidecar.origin.heads import HeadMemo
from sidecar.origin.operation import Operation, Rules, Verdict
from sidecar.origin.policy import (
    Deadline,
    is_retryable_answer,
    is_throttling,
    range_answer_problem,
)
from sidecar.origin.range_reader import (
    OriginAnswered,
    Progress,
    RangeReader,
    Sink,
)
from sidecar.origin.workers import OriginWorkers, Urgency
from sidecar.telemetry.metrics import Metrics

log = logging.getLogger(__name__)

T = TypeVar("T")

# Larger reads mean fewer trips through Python per byte; readers still see
# bytes as each chunk lands.
_READ_CHUNK = 1024 * 1024
_TRANSIENT = (
    BotoConnectionError, HTTPClientError, ReadTimeoutError, ResponseStreamingError,
    aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, OriginBadBody,
)
# The largest chunk a fetch hands its sink: the cache's checksum chunk.
_MAX_FETCH_CHUNK = 1024 * 1024
# Who gets the next free origin thread, by lane (a reader waiting on a part of
# a foreground fetch goes first of all: fetch_into's `waited_for`).
_URGENCY = {FOREGROUND: Urgency.FOREGROUND, PREFETCH: Urgency.PREFETCH, WARM: Urgency.WARM}
# How often the credentials the data port accepts are taken again from the
# origin's (temporary ones are renewed minutes before they expire).
_OWN_KEY_REFRESH_S = 60.0
# How long a presigned block GET stays valid: one fetch, with its retries, at most.
_PRESIGN_SECONDS = 900
_PRESIGNED_REUSE_S = 60.0


# Headers of an object's HEAD that describe the object itself and that S3
# repeats on every GET and HEAD of it (user metadata, encodings, encryption,
# version, storage class, lock and retention state), per the HeadObject and
# GetObject references. Checksums are kept apart (checksum_headers): they are
# of the whole object, and an SDK that checks them would fail every ranged answer.
_OBJECT_HEADERS = frozenset({
    "cache-control", "content-disposition", "content-encoding", "content-language",
    "expires", "x-amz-version-id", "x-amz-storage-class", "x-amz-website-redirect-location",
    "x-amz-server-side-encryption", "x-amz-server-side-encryption-aws-kms-key-id",
    "x-amz-server-side-encryption-bucket-key-enabled",
    "x-amz-server-side-encryption-customer-algorithm",
    "x-amz-server-side-encryption-customer-key-md5", "x-amz-object-lock-mode",
    "x-amz-object-lock-retain-until-date", "x-amz-object-lock-legal-hold",
    "x-amz-tagging-count", "x-amz-replication-status", "x-amz-restore", "x-amz-expiration",
    "x-amz-missing-meta",
})
_USER_METADATA_PREFIX = "x-amz-meta-"
# S3 caps user metadata at 2 KiB; an origin that allows more does not make an
# ObjectInfo (up to 8192 are remembered) grow without bound.
_MAX_OBJECT_HEADER_BYTES = 8 * 1024

# The object's checksums as a HEAD with `x-amz-checksum-mode: ENABLED` answers
# them (HeadObject reference, "Response Syntax"): one per algorithm S3 offers,
# and whether it is of the full object or composed of its parts' checksums.
_CHECKSUM_HEADERS = frozenset({
    "x-amz-checksum-crc32", "x-amz-checksum-crc32c", "x-amz-checksum-crc64nvme",
    "x-amz-checksum-sha1", "x-amz-checksum-sha256", "x-amz-checksum-type",
})
# A base64 SHA-256 is 44 characters, a composite checksum adds "-<parts>":
# an origin that sends more is not remembered for it.
_MAX_CHECKSUM_HEADER_BYTES = 512

# Headers S3 defines on its error answers that say something the client needs:
# the region a bucket lives in (on a 301 PermanentRedirect or 400 answer to a
# request for the wrong region, S3 API Reference, HeadBucket and "Error
# responses"), and of a delete marker (GetObject and HeadObject references: a
# key whose current version is a delete marker is answered 404 with
# `x-amz-delete-marker: true`, a version that is one 405 with its
# `Last-Modified`; both with the marker's `x-amz-version-id`). Nothing else
# of an error answer is repeated: the request id is the sidecar's own, and a
# Retry-After is decided by the sidecar, which has already retried.
_ERROR_HEADERS = frozenset({"x-amz-bucket-region"})
_DELETE_MARKER = "x-amz-delete-marker"
_DELETE_MARKER_HEADERS = frozenset({_DELETE_MARKER, "x-amz-version-id", "last-modified"})
# Region names and version ids are short; an origin's odd answer stays bounded.
_MAX_ERROR_HEADER_BYTES = 2 * 1024


def _kept(http_headers: Mapping[str, str], wanted: Callable[[str], bool], limit: int
          ) -> tuple[tuple[str, str], ...]:
    """The headers whose lower-case name is `wanted`, in name order, while their
    names and values add up to at most `limit` bytes."""
    kept: list[tuple[str, str]] = []
    total = 0
    for name, value in sorted((name.lower(), value) for name, value in http_headers.items()):
        if not wanted(name):
            continue
        total += len(name) + len(value)
        if total > limit:
            break
        kept.append((name, value))
    return tuple(kept)


def object_headers(http_headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The headers of a HEAD answer (botocore's lower-cased HTTPHeaders) that
    describe the object, bounded in size."""
    return _kept(
        http_headers,
        lambda name: name in _OBJECT_HEADERS or name.startswith(_USER_METADATA_PREFIX),
        _MAX_OBJECT_HEADER_BYTES,
    )


def checksum_headers(http_headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The whole object's checksums of a HEAD answer asked with checksum mode
    on, bounded in size (none if the origin keeps none, or did not say)."""
    return _kept(http_headers, _CHECKSUM_HEADERS.__contains__, _MAX_CHECKSUM_HEADER_BYTES)


def error_headers(http_headers: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The headers of an origin's error answer that S3 defines for it and that
    the client's answer must carry too (see _ERROR_HEADERS), bounded in size."""
    lowered = {name.lower(): value for name, value in http_headers.items()}
    delete_marker = lowered.get(_DELETE_MARKER, "").strip().lower() == "true"
    return _kept(
        lowered,
        lambda name: name in _ERROR_HEADERS or (delete_marker and name in _DELETE_MARKER_HEADERS),
        _MAX_ERROR_HEADER_BYTES,
    )


def translate_client_error(exc: ClientError, bucket: str, key: str) -> OriginError:
    """botocore's error answers, as `translate_answer` says."""
    code, status = _answer_of(exc)
    return translate_answer(status, code, bucket, key, _headers_of(exc))


def translate_answer(
    status: int, code: str, bucket: str, key: str, headers: Mapping[str, str] | None = None,
) -> OriginError:
    """One place maps the origin's S3 error codes to the sidecar's error types;
    the error keeps what of the answer's `headers` S3 defines for it (error_headers)."""
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    kept = error_headers(headers or {})
    if code == "NoSuchBucket":
        return BucketNotFound(f"{where}: no such bucket", headers=kept)
    if code in ("NoSuchKey", "404", "NotFound") or status == 404:
        return ObjectNotFound(f"{where}: no such key", headers=kept)
    if code in ("AccessDenied", "403", "Forbidden") or status == 403:
        return OriginAccessDenied(f"{where}: access denied by the origin", headers=kept)
    if code in ("PreconditionFailed", "InvalidRange", "412", "416") or status in (412, 416):
        return OriginObjectChanged(f"{where}: the object changed at the origin")
    if is_throttling(status, code):
        return OriginThrottled(f"{where}: origin answered {status} {code}")
    return OriginUnavailable(f"{where}: origin answered {status or code}", headers=kept)


def _answer_of(exc: ClientError) -> tuple[str, int]:
    error: dict[str, Any] = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _headers_of(exc: ClientError) -> Mapping[str, str]:
    headers: Mapping[str, str] = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return headers


def judge(exc: Exception, bucket: str, key: str) -> Verdict:
    """What one failed attempt means, the library's exception translated."""
    if isinstance(exc, ClientError):
        code, status = _answer_of(exc)
        return _answered(status, code, bucket, key, _headers_of(exc))
    if isinstance(exc, OriginAnswered):
        return _answered(exc.status, exc.code, bucket, key, exc.head.fields)
    described = repr(exc) if not str(exc) else f"{type(exc).__name__}: {exc}"
    where = f"s3://{bucket}/{key}"
    if isinstance(exc, OriginObjectChanged):
        return Verdict(OriginObjectChanged(f"{where}: {exc}"), False, None, described)
    if isinstance(exc, NoCredentialsError):
        return Verdict(OriginUnavailable(f"{where}: origin call failed: {exc!r}"), False, None,
                       described)
    if isinstance(exc, (*_TRANSIENT, BotoCoreError, OSError)):
        return Verdict(None, True, None, described)
    if isinstance(exc, OriginError):
        return Verdict(exc, False, None, described)
    return Verdict(OriginUnavailable(f"{where}: origin call failed: {exc!r}"), False, None,
                   described)


def _answered(
    status: int, code: str, bucket: str, key: str, headers: Mapping[str, str]
) -> Verdict:
    retryable = is_retryable_answer(status, code)
    return Verdict(None if retryable else translate_answer(status, code, bucket, key, headers),
                   retryable, is_throttling(status, code), f"{status} {code}")


class Origin:
    """The object store as the rest of the sidecar sees it."""

    def __init__(
        self,
        config: OriginConfig,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
        limiter: LaneLimiter | None = None,
    ) -> None:
        self._config = config
        self._limiter = limiter or LaneLimiter(None, {}, clock)
        self._metrics = metrics
        self._clock = clock
        self._jitter = jitter
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._credentials: Any = None
        self._own_key: tuple[str, str] | None = None
        self._key_refresher: asyncio.Task[None] | None = None
        self._heads = HeadMemo(ttl_s=config.head_ttl_s,
                               stale_if_error_s=config.head_stale_if_error_s, clock=clock)
        self._buckets: TTLCache[str, bool] = TTLCache(maxsize=256, ttl=60.0, timer=clock)
        self._listings: TTLCache[tuple[str, str], list[str]] = TTLCache(
            maxsize=4096, ttl=config.listing_ttl_s, timer=clock
        )
        # Presigned GET URLs, one per object, reused by its block fetches for a
        # minute of their 15: presigning (botocore's canonical request and HMACs
        # on the event loop) cost about as much as reading a block's worth of
        # chunks from the cache. A minute keeps every URL far from its expiry
        # and from the expiry of the temporary credentials it was signed with
        # (botocore refreshes those at least 10 minutes before they lapse).
        self._urls: TTLCache[tuple[str, str], str] = TTLCache(
            maxsize=1024, ttl=_PRESIGNED_REUSE_S, timer=clock
        )
        # The longest one attempt may wait for its answer or for the next byte
        # of its body: a stall is given up on (and the body resumed) while the
        # deadline still leaves time for another attempt.
        self._stall_s = min(config.read_timeout_s, config.deadline_s / 2)
        self.breaker = CircuitBreaker(
            BreakerSettings(
                failures=config.breaker_failures, failure_ratio=config.breaker_ratio,
                window_s=config.breaker_window_s, cool_down_s=config.breaker_cooldown_s,
            ),
            clock, self._breaker_changed,
        )
        self._show_breaker(BreakerState.CLOSED)
        self._rules = Rules(self.breaker, metrics, clock, jitter, config.retries,
                            config.deadline_s, judge)
        # Ranged GETs of blocks are read in these threads (sidecar.origin.range_reader),
        # one connection each; the aiobotocore client does the rest.
        self._reader = RangeReader(
            connect_timeout_s=config.connect_timeout_s, stall_timeout_s=self._stall_s,
            max_chunk_size=_MAX_FETCH_CHUNK, max_idle=config.max_connections,
        )
        self._workers = OriginWorkers(config.max_connections)
        # The lanes' budget is taken by the loop and by the fetch threads alike.
        self._limiter_lock = threading.Lock()

    async def start(self) -> None:
        session = get_session()
        client_config = AioConfig(
            max_pool_connections=self._config.max_connections,
            connect_timeout=self._config.connect_timeout_s,
            read_timeout=self._config.read_timeout_s,
            # Retries are made here, under the deadline and the breaker.
            retries={"total_max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
            # Presigned block GETs are SigV4 too (botocore presigns with SigV2
            # unless told), as every current S3 region requires.
            signature_version="s3v4",
        )
        self._client = await self._stack.enter_async_context(
            session.create_client(
                "s3", endpoint_url=self._config.endpoint, region_name=self._config.region,
                config=client_config,
            )
        )
        # The credentials the client signs with, resolved by the same chain
        # (environment, profile, web identity, instance role).
        self._credentials = await session.get_credentials()
        await self._refresh_own_key()
        self._key_refresher = asyncio.get_running_loop().create_task(self._refresh_own_keys())

    def set_limiter(self, limiter: LaneLimiter) -> None:
        """New bandwidth lanes (a configuration reload): every read from now on
        takes its budget from them; the old buckets' debts are forgotten."""
        with self._limiter_lock:
            self._limiter = limiter

    def own_key(self) -> tuple[str, str] | None:
        """The access key id and secret the sidecar signs its origin requests
        with, as they are now; None without credentials. The data port accepts
        requests signed with them (sidecar.s3.auth)."""
        return self._own_key

    async def _refresh_own_key(self) -> None:
        if self._credentials is None:
            self._own_key = None
            return
        # Temporary credentials (a role, web identity) are renewed here as
        # they near their expiry, as they would be for the next origin call.
        frozen = await self._credentials.get_frozen_credentials()
        self._own_key = (frozen.access_key, frozen.secret_key) \
            if frozen.access_key and frozen.secret_key else None

    async def _refresh_own_keys(self) -> None:
        while True:
            await asyncio.sleep(_OWN_KEY_REFRESH_S)
            try:
                await self._refresh_own_key()
            except Exception as exc:  # the old key serves until a refresh succeeds
                log.warning("could not refresh the origin credentials: %s", exc)

    async def close(self) -> None:
        if self._key_refresher is not None:
            self._key_refresher.cancel()
        self._reader.close()  # fetch threads blocked on the origin return now
        self._workers.shutdown()
        await self._stack.aclose()

    async def check_reachable(self) -> None:
        """Any HTTP answer means reachable; only a failure to talk at all is fatal.

        ListBuckets is used because every S3 implementation answers it, and a
        least-privilege key answers it with 403, which still proves the endpoint.
        """
        try:
            await self._call("foreground", "ListBuckets", self._client.list_buckets,
                             breaker=False)
        except OriginUnavailable as exc:
            if isinstance(exc.__cause__, ClientError):
                return  # it answered, if only 5xx
            if isinstance(exc.__cause__, NoCredentialsError):
                # Unavailable rather than misconfigured: an instance role's
                # metadata service or a mounted token may come up later.
                raise OriginUnavailable(
                    "no origin credentials found (set AWS_ACCESS_KEY_ID etc.)"
                ) from exc
            raise OriginUnavailable(
                f"origin {self._config.endpoint or 'AWS S3'} unreachable: {exc}"
            ) from exc
        except OriginError:
            return

    def forget(self, bucket: str, key: str) -> None:
        """A write or delete of the key went through: drop what is known of it
        (a HEAD still in flight is handed to its waiters, never remembered)."""
        self._heads.forget(bucket, key)
        self._urls.pop((bucket, key), None)

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        """Size and ETag of an object (sidecar.origin.heads: remembered for
        head_ttl, one HEAD at a time per key, stale-if-error)."""
        return await self._heads.get(bucket, key, lambda: self._head_uncached(bucket, key))

    def operation(
        self, lane: str, what: str, bucket: str = "", key: str = "", breaker: bool = True
    ) -> Operation:
        return Operation(self._rules, lane, what, bucket, key, breaker)

    async def _head_uncached(self, bucket: str, key: str) -> ObjectInfo:
        # Checksum mode on: S3 names the object's checksums only when asked
        # (HeadObject reference, ChecksumMode), and they are remembered for
        # the whole-object answers of clients that ask for them.
        try:
            response = await self._call(
                "foreground", f"HEAD s3://{bucket}/{key}",
                lambda: self._client.head_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED"),
                bucket, key,
            )
        except ObjectNotFound as exc:
            try:
                exists = await self.bucket_exists(bucket)
            except OriginError:
                exists = True  # the 404 stands: it must not turn into a stale answer
            if not exists:
                raise BucketNotFound(f"s3://{bucket}: no such bucket") from exc
            raise
        modified = response.get("LastModified") or datetime.now(UTC)
        http_headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        return ObjectInfo(
            bucket=bucket, key=key, size=int(response["ContentLength"]),
            etag=str(response.get("ETag", '""')), last_modified=modified,
            content_type=response.get("ContentType"),
            headers=object_headers(http_headers), checksums=checksum_headers(http_headers),
        )

    async def bucket_exists(self, bucket: str) -> bool:
        known = self._buckets.get(bucket)
        if known is not None:
            return known
        try:
            await self._call("foreground", f"HEAD s3://{bucket}",
                             lambda: self._client.head_bucket(Bucket=bucket), bucket, "")
            exists = True
        except (ObjectNotFound, BucketNotFound):
            exists = False
        except (OriginAccessDenied, OriginObjectChanged):
            exists = True
        self._buckets[bucket] = exists
        return exists

    async def list_keys(self, bucket: str, prefix: str) -> list[str]:
        """Keys under a prefix (ListObjectsV2, all pages), remembered for listing_ttl.

        Only Bucket, Prefix and the continuation token are sent: no delimiter.
        """
        cached = self._listings.get((bucket, prefix))
        if cached is not None:
            return cached
        keys: list[str] = []
        token: str | None = None
        while True:
            extra = {"ContinuationToken": token} if token else {}
            page = await self._call(
                "prefetch", f"LIST s3://{bucket}/{prefix}",
                functools.partial(self._client.list_objects_v2, Bucket=bucket, Prefix=prefix,
                                  **extra),
                bucket, prefix,
            )
            keys.extend(str(item["Key"]) for item in page.get("Contents", ()))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                break
        self._listings[(bucket, prefix)] = keys
        return keys

    async def _call(
        self, lane: str, what: str, call: Callable[[], Awaitable[T]],
        bucket: str = "", key: str = "", breaker: bool = True,
    ) -> T:
        """One origin request with retries, under the deadline and the breaker."""
        operation = self.operation(lane, what, bucket, key, breaker)
        while True:
            async with operation.attempt():
                return await self._within(operation.deadline, call)

    async def fetch_into(
        self, info: ObjectInfo, start: int, end: int, lane: str, sink: Sink, chunk_size: int,
        *, waited_for: bool = False,
    ) -> None:
        """Bytes [start, end) of the object to `sink`, chunk by chunk, read by a
        worker thread straight from the socket (sidecar.origin.range_reader).

        The same rules as `read_range`: a presigned GET with If-Match, the
        answer checked before any byte is used, a broken body resumed from the
        first chunk the sink did not take, retries under the deadline (renewed
        by progress) and the breaker. A sink that fails (the cache disk) ends
        it with the sink's own error, which is nobody's fault at the origin.
        """
        operation = self.operation(lane, f"GET s3://{info.bucket}/{info.key}",
                                   info.bucket, info.key)
        progress = Progress(start)
        urgency = Urgency.WAITED_FOR if waited_for and lane == FOREGROUND else _URGENCY[lane]
        counted = self._counting_sink(sink, lane)
        pace = self._pacer(lane)
        while progress.position < end:
            try:
                async with operation.attempt() as attempt:
                    before = progress.received
                    try:
                        url = await self._within(operation.deadline,
                                                 lambda: self._presign(info))
                        await asyncio.wrap_future(self._workers.submit(urgency, functools.partial(
                            self._reader.read, url, end, info.etag, info.size, counted,
                            progress, chunk_size, pace,
                        )))
                    except BaseException:
                        # Whatever went wrong (a 403 for a revoked key among it),
                        # the next attempt signs afresh.
                        self._urls.pop((info.bucket, info.key), None)
                        raise
                    finally:
                        if progress.received > before:
                            attempt.progressed()
            except OriginObjectChanged:
                self.forget(info.bucket, info.key)
                raise

    async def _presign(self, info: ObjectInfo) -> str:
        """A presigned GET of the object (its Range and If-Match headers are
        not signed, so one URL serves every block of it)."""
        where = (info.bucket, info.key)
        url = self._urls.get(where)
        if url is None:
            url = str(await self._client.generate_presigned_url(
                "get_object", Params={"Bucket": info.bucket, "Key": info.key},
                ExpiresIn=_PRESIGN_SECONDS,
            ))
            self._urls[where] = url
        return url

    def _counting_sink(self, sink: Sink, lane: str) -> Sink:
        counter = self._metrics.origin_bytes.labels(lane)

        def count(offset: int, data: memoryview) -> None:
            # Counted before the sink takes the chunk: from then on a reader may
            # have its bytes, and the counter already says they came from the
            # origin (prometheus counters are thread safe).
            counter.inc(len(data))
            sink(offset, data)

        return count

    def _pacer(self, lane: str) -> Callable[[int], None]:
        """The lane's bandwidth budget, taken chunk by chunk in the fetch thread."""
        if not self._limiter.limited:
            return lambda amount: None
        waits = self._metrics.ratelimit_wait.labels(lane)

        def pace(amount: int) -> None:
            while True:
                with self._limiter_lock:
                    grant = self._limiter.take(lane, amount)
                if grant.wait > 0:
                    waits.inc(grant.wait)
                    time.sleep(grant.wait)
                if grant.taken:
                    return

        return pace

    async def read_range(self, info: ObjectInfo, start: int, end: int, lane: str
                         ) -> AsyncGenerator[bytes, None]:
        """Yield the bytes of [start, end) in order, in chunks as they arrive.

        The GET carries If-Match so that a rewritten object can never be mixed
        with bytes of the old one. A body that breaks off is resumed from the
        first byte not yet yielded, until the deadline: it runs from the start
        and again from each chunk that arrives.
        """
        operation = self.operation(lane, f"GET s3://{info.bucket}/{info.key}",
                                   info.bucket, info.key)
        position = start
        while position < end:
            try:
                async with operation.attempt() as attempt:
                    async for chunk in self._get(info, position, end, lane, operation.deadline):
                        attempt.progressed()
                        position += len(chunk)
                        yield chunk
            except OriginObjectChanged:
                self.forget(info.bucket, info.key)
                raise

    async def _within(self, deadline: Deadline, call: Callable[[], Awaitable[T]]) -> T:
        """`call()`, given up on after the stall limit or at the deadline."""
        remaining = deadline.remaining()
        if remaining <= 0:
            raise TimeoutError("the origin deadline has passed")
        async with asyncio.timeout(min(remaining, self._stall_s)):
            return await call()

    async def _get(self, info: ObjectInfo, start: int, end: int, lane: str, deadline: Deadline
                   ) -> AsyncIterator[bytes]:
        response = await self._within(deadline, lambda: self._client.get_object(
            Bucket=info.bucket, Key=info.key, Range=f"bytes={start}-{end - 1}",
            IfMatch=info.etag,
        ))
        body = response["Body"]
        try:
            etag = response.get("ETag")
            if etag is not None and etag != info.etag:
                # An origin that ignores If-Match (RFC 9110 section 13.1.1 makes
                # it a MUST, not every S3 clone does it) sends the new version.
                raise OriginObjectChanged(
                    f"s3://{info.bucket}/{info.key}: ETag {etag} where {info.etag} was expected"
                )
            problem = range_answer_problem(
                response.get("ContentRange"), response.get("ContentLength"), start, end,
                info.size,
            )
            if problem is not None:
                raise OriginBadBody(f"s3://{info.bucket}/{info.key}: {problem}")
            remaining = end - start
            while remaining > 0:
                # The bandwidth lane's wait is the sidecar's, not the origin's.
                deadline.extend(await self._throttle(lane, min(_READ_CHUNK, remaining)))
                want = min(_READ_CHUNK, remaining)
                chunk = await self._within(deadline, functools.partial(body.read, want))
                if not chunk:
                    raise OriginBadBody(
                        f"s3://{info.bucket}/{info.key}: body ended {remaining} bytes short"
                    )
                if len(chunk) > remaining:
                    raise OriginBadBody(f"s3://{info.bucket}/{info.key}: body too long")
                remaining -= len(chunk)
                self._metrics.origin_bytes.labels(lane).inc(len(chunk))
                if remaining == 0:
                    # The last chunk is held until the body is seen to end: the
                    # block it completes must not be cached from an over-long body.
                    extra = await self._within(deadline, lambda: body.read(1))
                    if extra:
                        raise OriginBadBody(
                            f"s3://{info.bucket}/{info.key}: body longer than the "
                            f"{end - start} bytes asked"
                        )
                yield chunk
        finally:
            body.close()

    async def _throttle(self, lane: str, amount: int) -> float:
        """Wait until the lane may read `amount` more bytes from the origin; the wait."""
        waited = 0.0
        while True:
            with self._limiter_lock:
                grant = self._limiter.take(lane, amount)
            if grant.wait > 0:
                self._metrics.ratelimit_wait.labels(lane).inc(grant.wait)
                await asyncio.sleep(grant.wait)
                waited += grant.wait
            if grant.taken:
                return waited

    def _breaker_changed(self, old: BreakerState, new: BreakerState, why: str) -> None:
        level = logging.WARNING if new is BreakerState.OPEN else logging.INFO
        log.log(level, "origin circuit breaker %s -> %s: %s", old.value, new.value, why)
        self._show_breaker(new)

    def _show_breaker(self, state: BreakerState) -> None:
        for each in BreakerState:
            self._metrics.origin_breaker_state.labels(each.value).set(
                1 if each is state else 0
            )
