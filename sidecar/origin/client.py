"""The object store: one aiobotocore S3 client, ranged GETs and cached HEADs.

Every origin call is bounded by a deadline (`origin_deadline`) and goes through
a circuit breaker (sidecar.origin.breaker): retries of 500/503/SlowDown,
connection resets, stalls (no byte for `origin_read_timeout` or half the
deadline, whichever is shorter) and resumes of a broken body all stop at the
deadline, and a failing origin is not hammered. A ranged GET's deadline runs
from its last byte: a large read that keeps moving is not cut off for being
large. While the origin fails, an object's last HEAD answer stands in for up
to `head_stale_if_error` (RFC 5861 section 4), so cached blocks stay readable;
a 404 is an answer and is never papered over.
Retries are made here rather than by botocore, so that each attempt is seen by
the breaker and no retry sleeps past the deadline; the delays are botocore's
own full jitter (sidecar.origin.policy).

A ranged GET is checked before its bytes are used: its ETag must be the one the
read was planned against (If-Match is sent, and an origin that ignores it is
caught here), its Content-Range and Content-Length must be the range asked,
and the body must end exactly at the range's end. A body that breaks off is
resumed from the first byte not yet yielded; one that runs long is an error
before its last chunk is handed out, so the block it would complete is never
cached. Every botocore and aiohttp error is translated into `sidecar.errors` here.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
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
from cachetools import LRUCache, TTLCache

from sidecar.config import OriginConfig
from sidecar.errors import (
    BucketNotFound,
    ObjectNotFound,
    OriginAccessDenied,
    OriginBadBody,
    OriginCircuitOpen,
    OriginError,
    OriginObjectChanged,
    OriginThrottled,
    OriginUnavailable,
)
from sidecar.isolation.lanes import LaneLimiter
from sidecar.model import ObjectInfo
from sidecar.origin.breaker import BreakerSettings, BreakerState, CircuitBreaker
from sidecar.origin.policy import (
    Deadline,
    backoff_s,
    is_retryable_answer,
    is_throttling,
    range_answer_problem,
)
from sidecar.origin.range_reader import (
    OriginAnswered,
    Progress,
    RangeReader,
    Sink,
    SinkFailed,
)
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
# How long a presigned block GET stays valid: one fetch, with its retries, at most.
_PRESIGN_SECONDS = 900
# Objects whose last answered HEAD is kept for stale-if-error (bounded memory:
# an ObjectInfo is a few hundred bytes).
_KNOWN_OBJECTS = 16384


# Headers of an object's HEAD that describe the object itself and that S3
# repeats on every GET and HEAD of it (user metadata, encodings, encryption,
# version, storage class, lock and retention state), per the HeadObject and
# GetObject references. Checksums (x-amz-checksum-*) are left out: they are of
# the whole object, and an SDK that checks them would fail every ranged answer.
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


def object_headers(http_headers: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The headers of a HEAD answer (botocore's lower-cased HTTPHeaders) that
    describe the object, bounded in size."""
    kept: list[tuple[str, str]] = []
    total = 0
    for name, value in sorted(http_headers.items()):
        lower = name.lower()
        if lower not in _OBJECT_HEADERS and not lower.startswith(_USER_METADATA_PREFIX):
            continue
        total += len(lower) + len(value)
        if total > _MAX_OBJECT_HEADER_BYTES:
            break
        kept.append((lower, value))
    return tuple(kept)


def translate_client_error(exc: ClientError, bucket: str, key: str) -> OriginError:
    """botocore's error answers, as `translate_answer` says."""
    code, status = _answer_of(exc)
    return translate_answer(status, code, bucket, key)


def translate_answer(status: int, code: str, bucket: str, key: str) -> OriginError:
    """One place maps the origin's S3 error codes to the sidecar's error types."""
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    if code == "NoSuchBucket":
        return BucketNotFound(f"{where}: no such bucket")
    if code in ("NoSuchKey", "404", "NotFound") or status == 404:
        return ObjectNotFound(f"{where}: no such key")
    if code in ("AccessDenied", "403", "Forbidden") or status == 403:
        return OriginAccessDenied(f"{where}: access denied by the origin")
    if code in ("PreconditionFailed", "InvalidRange", "412", "416") or status in (412, 416):
        return OriginObjectChanged(f"{where}: the object changed at the origin")
    if is_throttling(status, code):
        return OriginThrottled(f"{where}: origin answered {status} {code}")
    return OriginUnavailable(f"{where}: origin answered {status or code}")


def _answer_of(exc: ClientError) -> tuple[str, int]:
    error: dict[str, Any] = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _retryable(exc: BaseException) -> bool:
    """Whether one attempt's failure is the origin's (worth a retry, counted by the breaker)."""
    if isinstance(exc, ClientError):
        code, status = _answer_of(exc)
        return is_retryable_answer(status, code)
    return isinstance(exc, (*_TRANSIENT, BotoCoreError)) and not isinstance(
        exc, NoCredentialsError
    )


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
        self._heads: TTLCache[tuple[str, str], ObjectInfo] = TTLCache(
            maxsize=8192, ttl=config.head_ttl_s, timer=clock
        )
        # The last HEAD answer of each object and when it came, for
        # stale-if-error (RFC 5861 section 4): cached blocks stay readable
        # through an origin outage once head_ttl has passed.
        self._known: LRUCache[tuple[str, str], tuple[ObjectInfo, float]] = LRUCache(
            maxsize=_KNOWN_OBJECTS
        )
        self._buckets: TTLCache[str, bool] = TTLCache(maxsize=256, ttl=60.0, timer=clock)
        self._listings: TTLCache[tuple[str, str], list[str]] = TTLCache(
            maxsize=4096, ttl=config.listing_ttl_s, timer=clock
        )
        self._heads_in_flight: dict[tuple[str, str], asyncio.Future[ObjectInfo]] = {}
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
        # Ranged GETs of blocks are read in these threads (sidecar.origin.range_reader),
        # one connection each; the aiobotocore client does the rest.
        self._reader = RangeReader(
            connect_timeout_s=config.connect_timeout_s, stall_timeout_s=self._stall_s,
            max_chunk_size=_MAX_FETCH_CHUNK, max_idle=config.max_connections,
        )
        self._fetch_threads = ThreadPoolExecutor(
            max_workers=config.max_connections, thread_name_prefix="sidecar-origin"
        )
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

    async def close(self) -> None:
        self._reader.close()  # fetch threads blocked on the origin return now
        self._fetch_threads.shutdown(wait=True, cancel_futures=True)
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
        """A write or delete of the key went through: drop what is known of it.

        A HEAD still in flight is taken off the table too, so that its answer,
        which may predate the write, is handed to those already waiting but never
        remembered, and the next reader asks anew.
        """
        self._heads.pop((bucket, key), None)
        self._known.pop((bucket, key), None)
        self._heads_in_flight.pop((bucket, key), None)

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        """Size and ETag of an object, remembered for head_ttl; one HEAD at a time per key.

        When the origin fails (not when it answers 404 or 403), the last answer
        is used for up to head_stale_if_error after it came.
        """
        cached = self._heads.get((bucket, key))
        if cached is not None:
            return cached
        pending = self._heads_in_flight.get((bucket, key))
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[ObjectInfo] = asyncio.get_running_loop().create_future()
        self._heads_in_flight[(bucket, key)] = future
        try:
            info, fresh = await self._head_or_stale(bucket, key)
            # Remembered only if no write passed through meanwhile (see forget).
            if fresh and self._heads_in_flight.get((bucket, key)) is future:
                self._heads[(bucket, key)] = info
                self._known[(bucket, key)] = (info, self._clock())
            future.set_result(info)
            return info
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # consumed here: waiters re-raise it themselves
            raise
        finally:
            if self._heads_in_flight.get((bucket, key)) is future:
                del self._heads_in_flight[(bucket, key)]

    async def _head_or_stale(self, bucket: str, key: str) -> tuple[ObjectInfo, bool]:
        """The origin's answer (fresh), or while it fails the last one known (not)."""
        try:
            return await self._head_uncached(bucket, key), True
        except OriginUnavailable as exc:
            known = self._known.get((bucket, key))
            if known is None or self._clock() - known[1] > self._config.head_stale_if_error_s:
                raise
            log.debug("s3://%s/%s: using the HEAD answer of %.0fs ago: %s",
                     bucket, key, self._clock() - known[1], exc)
            return known[0], False
        except OriginError:
            # 404 and 403 are answers, not failures: a deleted object is gone.
            self._known.pop((bucket, key), None)
            raise

    async def _head_uncached(self, bucket: str, key: str) -> ObjectInfo:
        try:
            response = await self._call(
                "foreground", f"HEAD s3://{bucket}/{key}",
                lambda: self._client.head_object(Bucket=bucket, Key=key), bucket, key,
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
        return ObjectInfo(
            bucket=bucket, key=key, size=int(response["ContentLength"]),
            etag=str(response.get("ETag", '""')), last_modified=modified,
            content_type=response.get("ContentType"),
            headers=object_headers(response.get("ResponseMetadata", {}).get("HTTPHeaders", {})),
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
                lambda: self._client.list_objects_v2(Bucket=bucket, Prefix=prefix, **extra),
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
        deadline = Deadline(self._config.deadline_s, self._clock)
        attempt = 0
        throttled = False
        while True:
            if breaker:
                self._admit(what)
            started = self._clock()
            try:
                result = await self._within(deadline, call)
            except Exception as exc:
                error = self._classify(lane, exc, started, bucket, key)
                if breaker:
                    self._verdict(error)
                if error is not None:
                    raise error from exc
                attempt += 1
                throttled = _throttling(exc, throttled)
                await self._before_retry(what, exc, attempt, deadline, throttled)
                continue
            except BaseException:  # cancelled: no verdict on the origin
                if breaker:
                    self.breaker.abandon()
                raise
            self._count(lane, None, started)
            if breaker:
                self.breaker.success()
            return result

    async def fetch_into(
        self, info: ObjectInfo, start: int, end: int, lane: str, sink: Sink, chunk_size: int
    ) -> None:
        """Bytes [start, end) of the object to `sink`, chunk by chunk, read by a
        worker thread straight from the socket (sidecar.origin.range_reader).

        The same rules as `read_range`: a presigned GET with If-Match, the
        answer checked before any byte is used, a broken body resumed from the
        first chunk the sink did not take, retries under the deadline (renewed
        by progress) and the breaker. A sink that fails (the cache disk) ends
        it with the sink's own error, which is nobody's fault at the origin.
        """
        what = f"GET s3://{info.bucket}/{info.key}"
        deadline = Deadline(self._config.deadline_s, self._clock)
        progress = Progress(start)
        attempt = 0
        throttled = False
        loop = asyncio.get_running_loop()
        counted = self._counting_sink(sink, lane)
        pace = self._pacer(lane)
        while progress.position < end:
            self._admit(what)
            started = self._clock()
            before = progress.received
            try:
                url = await self._within(deadline, lambda: self._presign(info))
                await loop.run_in_executor(
                    self._fetch_threads, self._reader.read, url, end, info.etag, info.size,
                    counted, progress, chunk_size, pace,
                )
            except SinkFailed as exc:
                self.breaker.abandon()  # the origin did its part; the disk did not
                raise exc.__cause__ or exc from None
            except asyncio.CancelledError:
                self.breaker.abandon()
                raise
            except Exception as exc:
                moved = progress.received > before
                error, retryable, now_throttled = self._judge(lane, exc, started, info)
                if moved:
                    attempt = 0
                    deadline.progress()
                    self.breaker.success()  # the origin answered with bytes
                if retryable:
                    self.breaker.failure()  # a body that broke off is a failure too
                else:
                    self.breaker.success()  # 404, 403, 412: a healthy origin's answers
                if isinstance(error, OriginObjectChanged):
                    self.forget(info.bucket, info.key)
                if error is not None:
                    raise error from exc
                attempt += 1
                throttled = now_throttled or throttled
                await self._before_retry(what, exc, attempt, deadline, throttled)
                continue
            self._count(lane, None, started)
            self.breaker.success()

    def _judge(
        self, lane: str, exc: Exception, started: float, info: ObjectInfo
    ) -> tuple[OriginError | None, bool, bool]:
        """A failed fetch attempt: (the error to raise now or None to retry,
        whether the origin is to blame, whether it was throttling)."""
        if isinstance(exc, OriginAnswered):
            translated = translate_answer(exc.status, exc.code, info.bucket, info.key)
            self._count(lane, translated, started)
            retryable = is_retryable_answer(exc.status, exc.code)
            return (None if retryable else translated), retryable, \
                is_throttling(exc.status, exc.code)
        self._count(lane, exc, started)
        if isinstance(exc, OriginObjectChanged):
            return OriginObjectChanged(f"s3://{info.bucket}/{info.key}: {exc}"), False, False
        if isinstance(exc, (*_TRANSIENT, OSError)):
            return None, True, False
        if isinstance(exc, OriginError):
            return exc, False, False
        return OriginUnavailable(f"s3://{info.bucket}/{info.key}: origin call failed: "
                                 f"{exc!r}"), False, False

    async def _presign(self, info: ObjectInfo) -> str:
        url: str = await self._client.generate_presigned_url(
            "get_object", Params={"Bucket": info.bucket, "Key": info.key},
            ExpiresIn=_PRESIGN_SECONDS,
        )
        return url

    def _counting_sink(self, sink: Sink, lane: str) -> Sink:
        counter = self._metrics.origin_bytes.labels(lane)

        def count(offset: int, data: memoryview) -> None:
            sink(offset, data)
            counter.inc(len(data))  # prometheus counters are thread safe

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
        what = f"GET s3://{info.bucket}/{info.key}"
        deadline = Deadline(self._config.deadline_s, self._clock)
        position = start
        attempt = 0
        throttled = False
        while position < end:
            self._admit(what)
            started = self._clock()
            judged = False  # the breaker has had its verdict on this attempt
            try:
                async for chunk in self._get(info, position, end, lane, deadline):
                    if not judged:
                        judged = True  # the origin is answering with bytes
                        self.breaker.success()
                    position += len(chunk)
                    attempt = 0
                    deadline.progress()
                    yield chunk
                self._count(lane, None, started)
            except Exception as exc:
                error = self._classify(lane, exc, started, info.bucket, info.key)
                if error is None or not judged:
                    self._verdict(error)  # a body that broke off is a failure too
                judged = True
                if isinstance(error, OriginObjectChanged):
                    self.forget(info.bucket, info.key)
                if error is not None:
                    raise error from exc
                attempt += 1
                throttled = _throttling(exc, throttled)
                await self._before_retry(what, exc, attempt, deadline, throttled)
            finally:
                if not judged:  # the reader went away, or the task was cancelled
                    self.breaker.abandon()

    def _classify(
        self, lane: str, exc: Exception, started: float, bucket: str, key: str
    ) -> OriginError | None:
        """Count a failed attempt; the error to raise now, or None to try again."""
        translated: Exception = (
            translate_client_error(exc, bucket, key) if isinstance(exc, ClientError) else exc
        )
        self._count(lane, translated, started)
        if _retryable(exc):
            return None
        if isinstance(translated, OriginError):
            return translated
        return OriginUnavailable(f"s3://{bucket}/{key}: origin call failed: {exc!r}")

    def _verdict(self, error: OriginError | None) -> None:
        """A failed attempt to the breaker: retryable failures count against the
        origin; a 404, 403 or 412 is a healthy origin's answer."""
        if error is None:
            self.breaker.failure()
        else:
            self.breaker.success()

    async def _before_retry(
        self, what: str, exc: BaseException, attempt: int, deadline: Deadline,
        throttled: bool,
    ) -> None:
        """Sleep before the next attempt, or raise when retries or the deadline ran out.

        `throttled`: the origin's last answer was SlowDown (or 429), which the
        client is then told too, whatever broke the last attempt.
        """
        delay = backoff_s(attempt, self._jitter(), throttled)
        if attempt > self._config.retries or not deadline.allows_sleep(delay):
            why = (f"{attempt} attempts failed" if attempt > self._config.retries
                   else f"no answer within the {deadline.seconds:g}s deadline")
            kind = OriginThrottled if throttled else OriginUnavailable
            raise kind(f"{what}: {why}; last: {_describe(exc)}") from exc
        log.debug("%s: retry %d in %.2fs after %s", what, attempt, delay, _describe(exc))
        await asyncio.sleep(delay)

    def _admit(self, what: str) -> None:
        if not self.breaker.allow():
            self._metrics.origin_breaker_rejected.inc()
            raise OriginCircuitOpen(f"{what}: the origin is failing (circuit breaker open)")

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
                chunk = await self._within(deadline, lambda: body.read(want))
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

    def _count(self, lane: str, error: BaseException | None, started: float) -> None:
        outcome = "ok"
        if isinstance(error, ObjectNotFound | BucketNotFound):
            outcome = "not_found"
        elif error is not None:
            outcome = "error"
        self._metrics.origin_requests.labels(lane, outcome).inc()
        self._metrics.origin_duration.labels(lane).observe(self._clock() - started)


def _throttling(exc: BaseException, before: bool) -> bool:
    """Whether the origin's last answer, after `exc`, was a throttling one."""
    if isinstance(exc, ClientError):
        code, status = _answer_of(exc)
        return is_throttling(status, code)
    return before


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ClientError):
        code, status = _answer_of(exc)
        return f"{status} {code}"
    return repr(exc) if not str(exc) else f"{type(exc).__name__}: {exc}"
