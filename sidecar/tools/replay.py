"""`sidecar replay`: read cold partitions the way a Kafka broker's remote reader does.

For every fetch Kafka's RemoteLogManager opens the segment object with an
open-ended range (`bytes=pos-`, RemoteLogInputStream), reads about
max.partition.fetch.bytes (more if the first batch is bigger: KIP-74's
"at least one batch"), hands the whole batches on and closes the stream. The next
fetch starts at the next offset, i.e. right after the last whole batch, so a
partial tail batch is read twice. Replay does the same, checks every batch
(CRC-32C and offset continuity) and measures what a consumer catching up sees.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
)
from botocore.handlers import set_list_objects_encoding_type_url

from sidecar.admin.token import client_token
from sidecar.errors import ConfigError, OriginError, OriginUnavailable
from sidecar.layout import SegmentKey, parse_aiven_key, segments_in_range
from sidecar.origin.client import translate_client_error
from sidecar.tools.kafka_segments import (
    BATCH_HEADER_SIZE,
    BatchCheckError,
    BatchScanner,
    parse_batch_header,
)
from sidecar.tools.range_answers import body_length, object_size
from sidecar.tools.replay_flags import DEFAULT_TIMEOUT_S

log = logging.getLogger(__name__)

MIB = 1024 * 1024
# Once fetch-bytes are in and the first batch is still incomplete (a batch larger
# than the fetch), read on in pieces of this size until it completes.
_TAIL_CHUNK = 64 * 1024
# How long --admin's stats may take to arrive, before and after the replay.
STATS_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class ReplayOptions:
    endpoint: str
    bucket: str
    prefix: str = ""
    topic: str | None = None
    partitions: frozenset[int] | None = None  # None: all
    fetch_bytes: int = MIB
    concurrency: int = 4
    region: str = "us-east-1"
    admin: str | None = None
    max_bytes: int | None = None
    # A broker never lists (segment metadata comes from __remote_log_metadata);
    # the listing only stands in for that, so it may come from the object store
    # itself when the endpoint read through (e.g. an older sidecar) cannot list.
    list_endpoint: str | None = None
    # Only the segments that hold part of this inclusive range, by offset or by
    # the first batch's timestamp (epoch ms), as a warm-up plan selects them.
    offsets: tuple[int, int | None] | None = None
    times_ms: tuple[int, int | None] | None = None
    # A progress line on stderr this often (0: none).
    progress_s: float = 10.0
    # Each request's connect timeout and the longest wait for any read of it.
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class PartitionPlan:
    topic: str
    topic_id: str
    partition: int
    segments: tuple[SegmentKey, ...]  # in offset order


@dataclass(frozen=True)
class FetchResult:
    size: int  # of the whole segment object
    latency_s: float
    consumed: int  # bytes of the whole batches delivered
    pending: int  # bytes of the partial tail batch (dropped, re-read next fetch)
    records: int
    batches: int
    next_offset: int | None
    error: str | None
    cache: str | None  # x-sidecar-cache header, if the endpoint sends one


def list_prefix(prefix: str, topic: str | None) -> str:
    # Aiven keys start with "{topic}-{topicId}/": "orders-" narrows the listing
    # (it can also match "orders-eu-...", which plan_partitions filters out).
    return f"{prefix}{topic}-" if topic else prefix


def plan_partitions(
    keys: Iterable[str], prefix: str, topic: str | None, partitions: frozenset[int] | None
) -> list[PartitionPlan]:
    """Group the `.log` segment keys per partition, each in offset order."""
    groups: dict[tuple[str, str, int], list[SegmentKey]] = {}
    for key in keys:
        segment = parse_aiven_key(key, prefix)
        if segment is None or segment.suffix != "log":
            continue
        if (topic is not None and segment.topic != topic) or (
            partitions is not None and segment.partition not in partitions
        ):
            continue
        groups.setdefault((segment.topic, segment.topic_id, segment.partition), []).append(segment)
    return [
        PartitionPlan(topic, topic_id, partition,
                      tuple(sorted(found, key=lambda s: s.start_offset)))
        for (topic, topic_id, partition), found in sorted(groups.items())
    ]


def next_fetch_position(position: int, consumed: int, pending: int, size: int) -> int | None:
    """Where the next fetch of this segment starts; None when the segment is done.

    Like the broker we continue right after the last whole batch. A fetch that
    reached the end of the object with a partial batch left means a truncated
    segment, and would otherwise be re-read forever.
    """
    following = position + consumed
    if following >= size:
        return None
    if consumed == 0 or following + pending >= size:
        raise BatchCheckError(
            f"segment ends inside a batch: {size - following} bytes at byte {following}")
    return following


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile (no interpolation: it is a latency someone saw)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def hit_ratios(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """Deltas of two `/api/v1/stats` snapshots taken around the replay."""
    hits = int(after["hits"]) - int(before["hits"])
    misses = int(after["misses"]) - int(before["misses"])
    cache = int(after["served_bytes"]["cache"]) - int(before["served_bytes"]["cache"])
    origin = int(after["served_bytes"]["origin"]) - int(before["served_bytes"]["origin"])
    origin_read = int(after["origin_bytes"]) - int(before["origin_bytes"])
    if min(hits, misses, cache, origin, origin_read) < 0:
        # Counters only fall when the sidecar restarted in between: the deltas
        # would mix two processes (a ratio of -40% or 170%).
        log.warning("the sidecar's counters went back during the replay (it restarted): "
                    "no hit ratio")
        return {"block_hit_ratio": None, "byte_hit_ratio": None, "origin_bytes": None}
    return {
        "block_hit_ratio": hits / (hits + misses) if hits + misses else None,
        "byte_hit_ratio": cache / (cache + origin) if cache + origin else None,
        "origin_bytes": origin_read,
    }


@dataclass
class Tally:
    """Running totals of one replay (mutable: every partition reader adds to it)."""

    partitions: int = 0
    segments: int = 0
    records: int = 0
    batches: int = 0
    bytes: int = 0
    errors: int = 0
    latencies_s: list[float] = field(default_factory=list)
    cache_headers: list[str] = field(default_factory=list)

    def add(self, fetch: FetchResult) -> None:
        self.records += fetch.records
        self.batches += fetch.batches
        self.bytes += fetch.consumed
        self.latencies_s.append(fetch.latency_s)
        if fetch.cache is not None:
            self.cache_headers.append(fetch.cache.strip().lower())


def build_report(
    options: ReplayOptions, tally: Tally, seconds: float, sidecar: Mapping[str, Any] | None
) -> dict[str, Any]:
    def ms(q: float) -> float | None:
        value = percentile(tally.latencies_s, q)
        return None if value is None else round(1000 * value, 3)

    headers = tally.cache_headers
    ratios = sidecar or {"block_hit_ratio": None, "byte_hit_ratio": None, "origin_bytes": None}
    return {
        "endpoint": options.endpoint, "bucket": options.bucket,
        "partitions": tally.partitions, "segments": tally.segments,
        "fetches": len(tally.latencies_s), "records": tally.records,
        "batches": tally.batches, "bytes": tally.bytes, "seconds": round(seconds, 6),
        "mb_per_s": round(tally.bytes / 1e6 / seconds, 3) if seconds > 0 else None,
        "mib_per_s": round(tally.bytes / MIB / seconds, 3) if seconds > 0 else None,
        "records_per_s": round(tally.records / seconds, 1) if seconds > 0 else None,
        "fetch_latency_ms": {"p50": ms(50), "p99": ms(99), "max": ms(100)},
        "crc_errors": tally.errors, **ratios,
        "fetch_hit_ratio": headers.count("hit") / len(headers) if headers else None,
    }


def counted(count: int, noun: str) -> str:
    """`1 partition`, `2 partitions`, `2 fetches`."""
    if count == 1:
        return f"1 {noun}"
    return f"{count:,} {noun}{'es' if noun.endswith(('s', 'sh', 'ch', 'x')) else 's'}"


def format_summary(report: Mapping[str, Any]) -> str:
    def pct(value: float | None) -> str:
        return "n/a" if value is None else f"{100 * value:.2f}%"

    def num(value: float | None, unit: str, digits: int = 1) -> str:
        return "n/a" if value is None else f"{value:,.{digits}f}{unit}"

    latency = report["fetch_latency_ms"]
    origin = report["origin_bytes"]
    return "\n".join([
        f"endpoint       {report['endpoint']}  bucket {report['bucket']}",
        f"read           {counted(report['partitions'], 'partition')}, "
        f"{counted(report['segments'], 'segment')}, {counted(report['fetches'], 'fetch')}",
        f"delivered      {report['records']:,} records in {report['batches']:,} batches, "
        f"{report['bytes'] / MIB:,.1f} MiB in {report['seconds']:.2f} s",
        f"throughput     {num(report['mib_per_s'], ' MiB/s', 2)}, "
        f"{num(report['records_per_s'], ' records/s', 0)}",
        f"fetch latency  p50 {num(latency['p50'], ' ms')}  p99 {num(latency['p99'], ' ms')}  "
        f"max {num(latency['max'], ' ms')}",
        f"batch checks   {report['crc_errors']} failed",
        f"hit rate       block {pct(report['block_hit_ratio'])}"
        f"  byte {pct(report['byte_hit_ratio'])}"
        f"  fetch {pct(report['fetch_hit_ratio'])}  origin read "
        f"{'n/a' if origin is None else f'{origin / MIB:,.1f} MiB'}",
    ])


class Replayer:
    """The I/O: list the segments, then one sequential reader per partition."""

    def __init__(self, options: ReplayOptions, client: Any, list_client: Any) -> None:
        self._options = options
        self._client = client
        self._list_client = list_client
        self.tally = Tally()

    async def list_keys(self) -> dict[str, int]:
        """Every key under the prefix, with its size."""
        # Only Bucket, Prefix and ContinuationToken, no Delimiter: benchmark
        # origins serve pre-generated listings keyed by prefix.
        prefix = list_prefix(self._options.prefix, self._options.topic)
        params = {"Bucket": self._options.bucket, "Prefix": prefix}
        keys: dict[str, int] = {}
        while True:
            page = await self.call(self._list_client.list_objects_v2(**params))
            # A 0-byte object has no batch to fetch (and `bytes=0-` on it is a 416).
            keys.update((item["Key"], int(item.get("Size", 1))) for item in page.get("Contents", [])
                        if item.get("Size", 1))
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return keys
            if token == params.get("ContinuationToken"):
                # The same page again, forever (botocore's paginators refuse it too).
                raise OriginUnavailable(
                    f"s3://{self._options.bucket}/{prefix}: the listing answered the same "
                    "continuation token twice")
            params["ContinuationToken"] = token

    async def select(self, plans: Sequence[PartitionPlan]) -> list[PartitionPlan]:
        """The plans with only the segments the offset or time range touches."""
        offsets, times = self._options.offsets, self._options.times_ms
        if offsets is None and times is None:
            return list(plans)
        selected = []
        for plan in plans:
            if offsets is not None:
                chosen = segments_in_range([s.start_offset for s in plan.segments], *offsets)
            else:
                assert times is not None
                stamps = [await self.first_timestamp(s.key) for s in plan.segments]
                chosen = segments_in_range(stamps, *times)
            if chosen:
                selected.append(dataclasses.replace(
                    plan, segments=tuple(plan.segments[i] for i in chosen)))
        return selected

    async def first_timestamp(self, key: str) -> int | None:
        """The segment's first batch's baseTimestamp (one small range read), None if
        it cannot be read: the segment then counts as inside the range."""
        try:
            response = await self.call(self._client.get_object(
                Bucket=self._options.bucket, Key=key, Range=f"bytes=0-{BATCH_HEADER_SIZE - 1}"),
                key)
            body = response["Body"]
            try:
                head = await self.call(body.read(), key)
            finally:
                body.close()
            return parse_batch_header(head).base_timestamp
        except (BatchCheckError, ValueError, ConfigError) as exc:
            log.warning("s3://%s/%s: no first batch timestamp (%s); replayed in case",
                        self._options.bucket, key, exc)
            return None

    async def report_progress(self, total: int, segments: int) -> None:
        """A line on stderr every progress_s until cancelled: bytes of the total,
        segments begun, the rate so far."""
        started = time.perf_counter()
        while True:
            await asyncio.sleep(self._options.progress_s)
            done, seconds = self.tally.bytes, time.perf_counter() - started
            print(f"replay: {done / MIB:,.1f} of {total / MIB:,.1f} MiB "
                  f"({100 * done // max(1, total)}%), {self.tally.segments} of {segments} "
                  f"segments, {done / MIB / seconds:,.1f} MiB/s", file=sys.stderr, flush=True)

    async def run(self, plans: Sequence[PartitionPlan]) -> None:
        pending: Iterator[PartitionPlan] = iter(plans)

        async def reader() -> None:
            for plan in pending:  # shared iterator: each partition is taken once
                await self.replay_partition(plan)

        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(min(self._options.concurrency, len(plans))):
                    group.create_task(reader())
        except ExceptionGroup as failed:
            # The first failure stops the replay (the others were cancelled by it);
            # the CLI reports one error, not a group.
            raise failed.exceptions[0] from None

    def _budget_spent(self) -> bool:
        limit = self._options.max_bytes
        return limit is not None and self.tally.bytes >= limit

    async def replay_partition(self, plan: PartitionPlan) -> None:
        if self._budget_spent():
            return
        self.tally.partitions += 1
        expected: int | None = None
        for segment in plan.segments:
            if self._budget_spent():
                return
            self.tally.segments += 1
            # Offsets run on from segment to segment; after a failed check the
            # position is lost, so the next segment starts at its own start offset.
            expected = await self._replay_segment(
                segment, segment.start_offset if expected is None else expected
            )

    async def _replay_segment(self, segment: SegmentKey, expected: int) -> int | None:
        """Fetch the segment to its end; the offset that must follow, None after an error."""
        position = 0
        while not self._budget_spent():
            fetch = await self._fetch(segment.key, position, expected)
            self.tally.add(fetch)
            try:
                if fetch.error is not None:
                    raise BatchCheckError(fetch.error)
                following = next_fetch_position(position, fetch.consumed, fetch.pending, fetch.size)
            except BatchCheckError as exc:
                self.tally.errors += 1
                log.warning("s3://%s/%s: %s", self._options.bucket, segment.key, exc)
                return None
            assert fetch.next_offset is not None  # at least one batch was checked
            expected = fetch.next_offset
            if following is None:
                return expected
            position = following
        return expected

    async def _fetch(self, key: str, position: int, expected: int) -> FetchResult:
        started = time.perf_counter()
        response = await self.call(
            self._client.get_object(Bucket=self._options.bucket, Key=key,
                                    Range=f"bytes={position}-"),
            key,
        )
        body = response["Body"]
        scanner = BatchScanner(expected_next_offset=expected)
        error = None
        try:
            try:
                declared = response.get("ContentLength")
                length = body_length(None if declared is None else int(declared),
                                     response.get("ContentRange"))
                size = object_size(position, length, response.get("ContentRange"))
            except OriginUnavailable as exc:
                raise OriginUnavailable(f"s3://{self._options.bucket}/{key}: {exc}") from None
            received = 0
            while received < length and (
                    received < self._options.fetch_bytes or not scanner.batches):
                wanted = self._options.fetch_bytes - received
                chunk = await self.call(body.read(wanted if wanted > 0 else _TAIL_CHUNK), key)
                if not chunk:
                    # aiohttp checks a Content-Length; a body without one (chunked,
                    # or ended by the close) is checked against its range here.
                    raise OriginUnavailable(f"s3://{self._options.bucket}/{key}: the body "
                                            f"ended after {received} of {length} bytes")
                received += len(chunk)
                scanner.feed(chunk)
        except BatchCheckError as exc:
            error = f"fetch from byte {position}: {exc}"  # the scanner counts from there
        finally:
            latency = time.perf_counter() - started
            # Drop the stream with the rest unread, as the broker does. aiohttp's
            # close() closes the connection rather than pooling it with unread data.
            body.close()
        headers = response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        return FetchResult(
            size=size, latency_s=latency, consumed=scanner.bytes_verified,
            pending=0 if error else scanner.pending_bytes, records=scanner.records,
            batches=scanner.batches, next_offset=scanner.expected_next_offset, error=error,
            cache=headers.get("x-sidecar-cache"),
        )

    async def call(self, awaitable: Any, key: str = "") -> Any:
        """Await one S3 call; its errors become sidecar.errors types here."""
        where = f"s3://{self._options.bucket}/{key}"
        try:
            return await awaitable
        except ClientError as exc:
            error: OriginError = translate_client_error(exc, self._options.bucket, key)
            if exc.response.get("Error", {}).get("Code") == "NotImplemented":
                raise ConfigError(f"{where}: the endpoint does not serve this request "
                                  "(listing through a sidecar? try --list-endpoint)") from exc
            if isinstance(error, OriginUnavailable):
                raise error from exc
            raise ConfigError(str(error)) from exc
        except NoCredentialsError as exc:
            raise ConfigError("no credentials found (set AWS_ACCESS_KEY_ID etc.)") from exc
        except ParamValidationError as exc:
            # botocore refused the request before sending it: no endpoint was
            # tried, so it is no reason to retry later.
            refused = str(exc).splitlines()[-1].partition(":")[0]
            raise ConfigError(f"{where}: not a valid request ({refused})") from exc
        except (ConnectTimeoutError, ReadTimeoutError):
            # An endpoint that accepts the connection and never answers (a hung
            # process, a firewall that drops): botocore's text is a URL and a repr.
            raise OriginUnavailable(f"{where}: no answer from the endpoint within "
                                    f"{self._options.timeout_s:g} s (--timeout)") from None
        except (TimeoutError, BotoCoreError, OSError, aiohttp.ClientError) as exc:
            # aiohttp.ClientPayloadError: a body cut short (a reset, or a close
            # before its Content-Length), which aiobotocore passes on unwrapped.
            raise OriginUnavailable(f"{where}: endpoint unreachable or failed: {exc}") from exc


async def _read_stats(admin: str) -> dict[str, Any]:
    url = admin.rstrip("/") + "/api/v1/stats"
    # Off loopback the stats need the admin token (SIDECAR_ADMIN_TOKEN[_FILE]).
    token = client_token(os.environ)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # On the event loop, not urllib in a thread: Ctrl-C cancels the read at once,
    # where asyncio.run would wait for the thread until its socket timed out.
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=STATS_TIMEOUT_S)
                                         ) as session, \
                session.get(url, headers=headers) as response:
            if response.status != 200:
                raise ConfigError(f"cannot read {url}: HTTP {response.status} {response.reason}")
            stats = json.loads(await response.read())
    except TimeoutError:
        raise ConfigError(f"cannot read {url}: no answer in {STATS_TIMEOUT_S:g} s") from None
    except (aiohttp.ClientError, ValueError) as exc:
        raise ConfigError(f"cannot read {url}: {exc}") from None
    if not isinstance(stats, dict):
        raise ConfigError(f"{url}: not a sidecar's stats (a JSON {type(stats).__name__})")
    return stats


def _client_config(concurrency: int, timeout_s: float) -> AioConfig:
    return AioConfig(
        # read_timeout bounds each wait for bytes (the first of the answer, then
        # every read of the body), not the whole transfer: a slow segment is fine.
        max_pool_connections=concurrency + 2, connect_timeout=timeout_s, read_timeout=timeout_s,
        # max_attempts counts the retries: 4 attempts in all (--timeout's help says so).
        retries={"mode": "standard", "max_attempts": 3}, s3={"addressing_style": "path"},
        # Batches carry their own CRC; whole-object checksums mean nothing for a
        # range (and "when_supported" would add x-amz-checksum-mode to each GET).
        request_checksum_calculation="when_required", response_checksum_validation="when_required",
    )


async def run_replay(options: ReplayOptions) -> dict[str, Any]:
    """List, replay, measure; the report of the contract (see build_report)."""
    session = get_session()
    config = _client_config(options.concurrency, options.timeout_s)
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(session.create_client(
            "s3", endpoint_url=options.endpoint, region_name=options.region, config=config))
        list_client = client
        if options.list_endpoint and options.list_endpoint != options.endpoint:
            list_client = await stack.enter_async_context(session.create_client(
                "s3", endpoint_url=options.list_endpoint, region_name=options.region,
                config=config))
        # botocore adds EncodingType=url to every listing; keep the query to Prefix.
        list_client.meta.events.unregister(
            "before-parameter-build.s3.ListObjectsV2", set_list_objects_encoding_type_url)
        replayer = Replayer(options, client, list_client)
        sizes = await replayer.list_keys()
        plans = plan_partitions(sizes, options.prefix, options.topic, options.partitions)
        if not plans:
            where = f"s3://{options.bucket}/{list_prefix(options.prefix, options.topic)}"
            raise ConfigError(f"no Kafka segments (Aiven-layout .log keys) under {where}")
        plans = await replayer.select(plans)
        if not plans:
            raise ConfigError("no segment holds any of the range asked for")
        segments = [segment for plan in plans for segment in plan.segments]
        total = sum(sizes[segment.key] for segment in segments)
        if options.max_bytes is not None:
            total = min(total, options.max_bytes)
        before = await _read_stats(options.admin) if options.admin else None
        # Timed without the listing: a broker has its segment metadata at hand.
        started = time.perf_counter()
        progress = (asyncio.create_task(replayer.report_progress(total, len(segments)))
                    if options.progress_s > 0 else None)
        try:
            await replayer.run(plans)
        finally:
            if progress is not None:
                progress.cancel()
        seconds = time.perf_counter() - started
        after = await _read_stats(options.admin) if options.admin else None
    try:
        ratios = hit_ratios(before, after) if before is not None and after is not None else None
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(
            f"{options.admin}/api/v1/stats: not a sidecar's stats ({exc!r})") from None
    return build_report(options, replayer.tally, seconds, ratios)
