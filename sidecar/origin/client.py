"""The object store as the rest of the sidecar sees it: HEADs (remembered,
sidecar.origin.heads), listings, ranged GETs for readers that bypass the cache
(aiobotocore), and block fetches read by worker threads straight into the
cache (sidecar.origin.block_fetches). Credentials the data port accepts are in
sidecar.origin.credentials, the lanes' budget in sidecar.origin.bandwidth.

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
`sidecar.errors` in one place (sidecar.origin.answers, `judge`).
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime
from typing import Any, TypeVar

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError, NoCredentialsError
from cachetools import TTLCache

from sidecar.config import OriginConfig
from sidecar.errors import (
    BucketNotFound,
    ObjectNotFound,
    OriginAccessDenied,
    OriginBadBody,
    OriginError,
    OriginObjectChanged,
    OriginUnavailable,
)
from sidecar.isolation.lanes import LaneLimiter
from sidecar.model import ObjectInfo
from sidecar.origin.answers import (
    checksum_headers,
    error_headers,
    judge,
    object_headers,
    object_size,
    translate_answer,
    translate_client_error,
)
from sidecar.origin.bandwidth import Bandwidth
from sidecar.origin.block_fetches import BlockFetches
from sidecar.origin.breaker import BreakerSettings, BreakerState, CircuitBreaker
from sidecar.origin.credentials import OwnKey
from sidecar.origin.heads import HeadMemo
from sidecar.origin.operation import Operation, Rules, within
from sidecar.origin.policy import Deadline, range_answer_problem
from sidecar.origin.range_reader import Sink
from sidecar.telemetry.metrics import Metrics

# What callers import from here; their homes are the rooms named above.
__all__ = [
    "Origin", "checksum_headers", "error_headers", "judge", "object_headers",
    "translate_answer", "translate_client_error",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

# The `lane` label of origin requests that upload the sidecar's own files (rotated
# access logs): no read waits for them.
UPLOAD_LANE = "upload"

# Keys a next-segment lookup reads after the segment being read: its own other
# objects and the next segment's lie within a few, with room for copies left
# by failed uploads; past them the read-ahead just stays in its segment.
AFTER_PAGE_KEYS = 64

# Larger reads mean fewer trips through Python per byte; readers still see
# bytes as each chunk lands.
_READ_CHUNK = 1024 * 1024


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
        self._bandwidth = Bandwidth(limiter or LaneLimiter(None, {}, clock), metrics)
        self._metrics = metrics
        self._stack = AsyncExitStack()
        self._client: Any = None
        self._own_key = OwnKey()
        self._heads = HeadMemo(ttl_s=config.head_ttl_s,
                               stale_if_error_s=config.head_stale_if_error_s, clock=clock)
        self._buckets: TTLCache[str, bool] = TTLCache(maxsize=256, ttl=60.0, timer=clock)
        self._listings: TTLCache[tuple[str, str, str], list[str]] = TTLCache(
            maxsize=4096, ttl=config.listing_ttl_s, timer=clock
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
        # Block fetches: presigned here, read by worker threads into the cache.
        self._blocks = BlockFetches(config, metrics, self._bandwidth, clock, self._stall_s)

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
        self._blocks.use_client(self._client)
        await self._own_key.start(session)

    def set_limiter(self, limiter: LaneLimiter) -> None:
        """New bandwidth lanes (a configuration reload): every read takes its
        budget from them from its next chunk on, reads under way too; the new
        buckets start from the old ones' tokens and debts (LaneLimiter.continue_from)."""
        self._bandwidth.replace(limiter)

    def own_key(self) -> tuple[str, str] | None:
        """The access key id and secret the sidecar signs its origin requests
        with, as they are now; None without credentials. The data port accepts
        requests signed with them (sidecar.s3.auth)."""
        return self._own_key.current()

    async def close(self) -> None:
        self._own_key.stop()
        await self._blocks.close()
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
        self._blocks.forget(bucket, key)

    def remembered_head(self, bucket: str, key: str) -> ObjectInfo | None:
        """The object's HEAD answer if one is remembered and fresh, without
        asking the origin (plain ranged reads': sidecar.s3.plain_ranges)."""
        return self._heads.remembered(bucket, key)

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
        async def head_object() -> tuple[dict[str, Any], int]:
            # The size is read inside the attempt: an answer without one is
            # judged, retried and counted like any other malformed answer.
            response: dict[str, Any] = await self._client.head_object(
                Bucket=bucket, Key=key, ChecksumMode="ENABLED")
            return response, object_size(response, bucket, key)

        try:
            response, size = await self._call(
                "foreground", f"HEAD s3://{bucket}/{key}", head_object, bucket, key)
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
            bucket=bucket, key=key, size=size,
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

    async def list_keys(self, bucket: str, prefix: str, start_after: str = "") -> list[str]:
        """Keys under a prefix (ListObjectsV2), remembered for listing_ttl.

        Only Bucket, Prefix, StartAfter and the continuation token are sent: no
        delimiter. With `start_after`, only the first AFTER_PAGE_KEYS keys that
        sort after it: a partition's next segment sorts right after the one
        being read (its offset is zero-padded to 20 digits; in between lie only
        the current segment's other objects and any copies a failed upload left),
        so a partition with a long tiered history is not listed whole, a page
        per 1,000 keys, to find it, and what is kept for listing_ttl stays a
        few kilobytes however many segments the partition holds.
        """
        remembered = (bucket, prefix, start_after)
        cached = self._listings.get(remembered)
        if cached is not None:
            return cached
        keys: list[str] = []
        token: str | None = None
        while True:
            extra: dict[str, str | int] = {"ContinuationToken": token} if token else {}
            if start_after:
                extra["StartAfter"] = start_after
                extra["MaxKeys"] = AFTER_PAGE_KEYS
            page = await self._call(
                "prefetch", f"LIST s3://{bucket}/{prefix}",
                functools.partial(self._client.list_objects_v2, Bucket=bucket, Prefix=prefix,
                                  **extra),
                bucket, prefix,
            )
            keys.extend(str(item["Key"]) for item in page.get("Contents", ()))
            token = page.get("NextContinuationToken")
            if start_after or not page.get("IsTruncated") or not token:
                break
        self._listings[remembered] = keys
        return keys

    async def upload(self, bucket: str, key: str, parts: AsyncIterator[bytes],
                     content_type: str) -> int:
        """A new object made of the non-empty `parts` (each but the last at least 5 MiB,
        S3's multipart minimum), as one multipart upload; its size.

        Each request is retried under the deadline like any other, but never seen
        by the circuit breaker: an upload the origin refuses (no PutObject right on
        that bucket, say) says nothing of whether reads can go through. A failed
        upload is aborted, so no part is left to be billed (S3 User Guide,
        "Aborting a multipart upload"); a cancelled one is left to the bucket's
        lifecycle rule for incomplete uploads.
        """
        what = f"PUT s3://{bucket}/{key}"

        def call(method: Callable[..., Awaitable[Any]], **arguments: Any) -> Awaitable[Any]:
            return self._call(UPLOAD_LANE, what, functools.partial(
                method, Bucket=bucket, Key=key, **arguments), bucket, key, breaker=False)

        created = await call(self._client.create_multipart_upload, ContentType=content_type)
        upload_id = created["UploadId"]
        done: list[dict[str, Any]] = []
        size = 0
        try:
            async for body in parts:
                answer = await call(self._client.upload_part, UploadId=upload_id,
                                    PartNumber=len(done) + 1, Body=body)
                done.append({"ETag": answer["ETag"], "PartNumber": len(done) + 1})
                size += len(body)
            await call(self._client.complete_multipart_upload, UploadId=upload_id,
                       MultipartUpload={"Parts": done})
        except Exception:
            try:
                await call(self._client.abort_multipart_upload, UploadId=upload_id)
            except Exception as exc:  # the upload's own error is the one to report
                log.debug("%s: abort failed: %s", what, exc)
            raise
        return size

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
        worker thread straight from the socket (sidecar.origin.block_fetches).

        The same rules as `read_range`: a presigned GET with If-Match, the
        answer checked before any byte is used, a broken body resumed from the
        first chunk the sink did not take, retries under the deadline (renewed
        by progress) and the breaker. A sink that fails (the cache disk) ends
        it with the sink's own error, which is nobody's fault at the origin.
        """
        operation = self.operation(lane, f"GET s3://{info.bucket}/{info.key}",
                                   info.bucket, info.key)
        try:
            await self._blocks.fetch_into(operation, info, start, end, lane, sink, chunk_size,
                                          waited_for)
        except OriginObjectChanged:
            self.forget(info.bucket, info.key)
            raise

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
        return await within(deadline, self._stall_s, call)

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
                deadline.extend(await self._bandwidth.throttle(lane, min(_READ_CHUNK, remaining)))
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

    def _breaker_changed(self, old: BreakerState, new: BreakerState, why: str) -> None:
        level = logging.WARNING if new is BreakerState.OPEN else logging.INFO
        log.log(level, "origin circuit breaker %s -> %s: %s", old.value, new.value, why)
        self._show_breaker(new)

    def _show_breaker(self, state: BreakerState) -> None:
        for each in BreakerState:
            self._metrics.origin_breaker_state.labels(each.value).set(
                1 if each is state else 0
            )
