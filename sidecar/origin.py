"""The object store: one aiobotocore S3 client, ranged GETs and cached HEADs.

botocore's "standard" retry mode already retries throttling, 5xx and connection
errors with exponential backoff and full jitter before a response starts. A body
that breaks off mid-stream is not covered by it, so `read_range` resumes from
the first byte it did not get, with the same kind of jittered backoff. Every
botocore and aiohttp error is translated into `sidecar.errors` here.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError as BotoConnectionError,
    HTTPClientError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from cachetools import TTLCache

from sidecar.config import OriginConfig
from sidecar.errors import (
    BucketNotFound,
    ConfigError,
    ObjectNotFound,
    OriginAccessDenied,
    OriginError,
    OriginObjectChanged,
    OriginUnavailable,
)
from sidecar.isolation.lanes import LaneLimiter
from sidecar.metrics import Metrics

# Larger reads mean fewer trips through Python per byte; readers still see
# bytes as each chunk lands.
_READ_CHUNK = 1024 * 1024
_TRANSIENT = (
    BotoConnectionError, HTTPClientError, ReadTimeoutError, ResponseStreamingError,
    aiohttp.ClientError, asyncio.TimeoutError, ConnectionError,
)


@dataclass(frozen=True)
class ObjectInfo:
    bucket: str
    key: str
    size: int
    etag: str  # as the origin sends it, with quotes
    last_modified: datetime
    content_type: str | None = None


def translate_client_error(exc: ClientError, bucket: str, key: str) -> OriginError:
    """One place maps the origin's S3 error codes to the sidecar's error types."""
    error: dict[str, Any] = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    where = f"s3://{bucket}/{key}" if key else f"s3://{bucket}"
    if code == "NoSuchBucket":
        return BucketNotFound(f"{where}: no such bucket")
    if code in ("NoSuchKey", "404", "NotFound") or status == 404:
        return ObjectNotFound(f"{where}: no such key")
    if code in ("AccessDenied", "403", "Forbidden") or status == 403:
        return OriginAccessDenied(f"{where}: access denied by the origin")
    if code in ("PreconditionFailed", "InvalidRange", "412", "416") or status in (412, 416):
        return OriginObjectChanged(f"{where}: the object changed at the origin")
    return OriginUnavailable(f"{where}: origin answered {status or code}")


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
        self._buckets: TTLCache[str, bool] = TTLCache(maxsize=256, ttl=60.0, timer=clock)
        self._listings: TTLCache[tuple[str, str], list[str]] = TTLCache(
            maxsize=4096, ttl=config.listing_ttl_s, timer=clock
        )
        self._heads_in_flight: dict[tuple[str, str], asyncio.Future[ObjectInfo]] = {}

    async def start(self) -> None:
        session = get_session()
        client_config = AioConfig(
            max_pool_connections=self._config.max_connections,
            connect_timeout=self._config.connect_timeout_s,
            read_timeout=self._config.read_timeout_s,
            retries={"max_attempts": self._config.retries + 1, "mode": "standard"},
            s3={"addressing_style": "path"},
        )
        self._client = await self._stack.enter_async_context(
            session.create_client(
                "s3", endpoint_url=self._config.endpoint, region_name=self._config.region,
                config=client_config,
            )
        )

    async def close(self) -> None:
        await self._stack.aclose()

    async def check_reachable(self) -> None:
        """Any HTTP answer means reachable; only a failure to talk at all is fatal.

        ListBuckets is used because every S3 implementation answers it, and a
        least-privilege key answers it with 403, which still proves the endpoint.
        """
        try:
            await self._client.list_buckets()
        except ClientError:
            return
        except NoCredentialsError as exc:
            raise ConfigError("no origin credentials found (set AWS_ACCESS_KEY_ID etc.)") from exc
        except (*_TRANSIENT, BotoCoreError) as exc:
            raise OriginUnavailable(
                f"origin {self._config.endpoint or 'AWS S3'} unreachable: {exc}"
            ) from exc

    def forget(self, bucket: str, key: str) -> None:
        self._heads.pop((bucket, key), None)

    async def head(self, bucket: str, key: str) -> ObjectInfo:
        """Size and ETag of an object, remembered for head_ttl; one HEAD at a time per key."""
        cached = self._heads.get((bucket, key))
        if cached is not None:
            return cached
        pending = self._heads_in_flight.get((bucket, key))
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[ObjectInfo] = asyncio.get_running_loop().create_future()
        self._heads_in_flight[(bucket, key)] = future
        try:
            info = await self._head_uncached(bucket, key)
            self._heads[(bucket, key)] = info
            future.set_result(info)
            return info
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # consumed here: waiters re-raise it themselves
            raise
        finally:
            del self._heads_in_flight[(bucket, key)]

    async def _head_uncached(self, bucket: str, key: str) -> ObjectInfo:
        started = self._clock()
        try:
            response = await self._client.head_object(Bucket=bucket, Key=key)
        except ClientError as exc:
            error = translate_client_error(exc, bucket, key)
            self._count("foreground", error, started)
            if isinstance(error, ObjectNotFound) and not await self.bucket_exists(bucket):
                raise BucketNotFound(f"s3://{bucket}: no such bucket") from exc
            raise error from exc
        except (*_TRANSIENT, BotoCoreError) as exc:
            self._count("foreground", exc, started)
            raise OriginUnavailable(f"s3://{bucket}/{key}: origin unreachable: {exc}") from exc
        self._count("foreground", None, started)
        modified = response.get("LastModified") or datetime.now(timezone.utc)
        return ObjectInfo(
            bucket=bucket, key=key, size=int(response["ContentLength"]),
            etag=str(response.get("ETag", '""')), last_modified=modified,
            content_type=response.get("ContentType"),
        )

    async def bucket_exists(self, bucket: str) -> bool:
        known = self._buckets.get(bucket)
        if known is not None:
            return known
        try:
            await self._client.head_bucket(Bucket=bucket)
            exists = True
        except ClientError as exc:
            exists = not isinstance(translate_client_error(exc, bucket, ""), ObjectNotFound)
        except (*_TRANSIENT, BotoCoreError) as exc:
            raise OriginUnavailable(f"s3://{bucket}: origin unreachable: {exc}") from exc
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
        started = self._clock()
        try:
            while True:
                extra = {"ContinuationToken": token} if token else {}
                page = await self._client.list_objects_v2(Bucket=bucket, Prefix=prefix, **extra)
                keys.extend(str(item["Key"]) for item in page.get("Contents", ()))
                token = page.get("NextContinuationToken")
                if not page.get("IsTruncated") or not token:
                    break
        except ClientError as exc:
            error = translate_client_error(exc, bucket, prefix)
            self._count("prefetch", error, started)
            raise error from exc
        except (*_TRANSIENT, BotoCoreError) as exc:
            self._count("prefetch", exc, started)
            raise OriginUnavailable(f"s3://{bucket}/{prefix}: listing failed: {exc}") from exc
        self._count("prefetch", None, started)
        self._listings[(bucket, prefix)] = keys
        return keys

    async def read_range(self, info: ObjectInfo, start: int, end: int, lane: str
                         ) -> AsyncIterator[bytes]:
        """Yield the bytes of [start, end) in order, in chunks as they arrive.

        The GET carries If-Match so that a rewritten object can never be mixed
        with bytes of the old one. A body that breaks off is resumed from the
        first byte not yet yielded.
        """
        position = start
        attempt = 0
        while position < end:
            started = self._clock()
            try:
                async for chunk in self._get(info, position, end, lane):
                    position += len(chunk)
                    attempt = 0
                    yield chunk
                self._count(lane, None, started)
            except ClientError as exc:
                error = translate_client_error(exc, info.bucket, info.key)
                self._count(lane, error, started)
                if isinstance(error, OriginObjectChanged):
                    self.forget(info.bucket, info.key)
                raise error from exc
            except (*_TRANSIENT, BotoCoreError) as exc:
                self._count(lane, exc, started)
                attempt += 1
                if attempt > self._config.retries:
                    raise OriginUnavailable(
                        f"s3://{info.bucket}/{info.key}: origin read failed: {exc}"
                    ) from exc
                # Full jitter (as botocore's standard mode): spreads the retries
                # of many readers hitting the same failing origin.
                await asyncio.sleep(self._jitter() * min(2.0, 0.05 * 2**attempt))

    async def _get(self, info: ObjectInfo, start: int, end: int, lane: str
                   ) -> AsyncIterator[bytes]:
        response = await self._client.get_object(
            Bucket=info.bucket, Key=info.key, Range=f"bytes={start}-{end - 1}", IfMatch=info.etag
        )
        body = response["Body"]
        try:
            remaining = end - start
            while remaining > 0:
                await self._throttle(lane, min(_READ_CHUNK, remaining))
                chunk = await body.read(min(_READ_CHUNK, remaining))
                if not chunk:
                    raise ResponseStreamingError(error=f"body ended {remaining} bytes short")
                remaining -= len(chunk)
                self._metrics.origin_bytes.labels(lane).inc(len(chunk))
                yield chunk
        finally:
            body.close()

    async def _throttle(self, lane: str, amount: int) -> None:
        """Wait until the lane may read `amount` more bytes from the origin."""
        while True:
            grant = self._limiter.take(lane, amount)
            if grant.wait > 0:
                self._metrics.ratelimit_wait.labels(lane).inc(grant.wait)
                await asyncio.sleep(grant.wait)
            if grant.taken:
                return

    def _count(self, lane: str, error: BaseException | None, started: float) -> None:
        outcome = "ok"
        if isinstance(error, ObjectNotFound | BucketNotFound):
            outcome = "not_found"
        elif error is not None:
            outcome = "error"
        self._metrics.origin_requests.labels(lane, outcome).inc()
        self._metrics.origin_duration.labels(lane).observe(self._clock() - started)
