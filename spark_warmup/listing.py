"""Executor side: list a topic's partitions and a partition's segments in the object store.

Runs inside Spark tasks, so every call makes its own boto3 client from the plan's
origin (credentials from the executor's AWS_* environment or its usual chain)
and returns errors as values: an exception would reach the driver as a Java
stack trace instead of a message naming the plan field that is wrong.

Keys are parsed by the pure `sidecar.layout` (Aiven layout):
`{prefix}{topic}-{topicId}/{partition}/{startOffset:020d}-{segmentId}.log`.
For time ranges each segment's first record batch header is read with one
ranged GET of its first 61 bytes (layout in docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any

from sidecar.layout import parse_aiven_key
from spark_warmup.plan import OriginSpec
from spark_warmup.selection import Segment

BATCH_HEADER_SIZE = 61
# baseTimestamp i64 @27 and maxTimestamp i64 @35 of the v2 record batch header;
# magic i8 @16 must be 2 for that layout to hold.
_TIMES = struct.Struct(">qq")
_TIMES_AT = 27
_MAGIC_AT = 16
_HEADER_READERS = 8
_TOPIC_ID_LENGTH = 22  # Kafka Uuid as URL-safe base64 without padding


@dataclass(frozen=True)
class TopicListing:
    topic: str
    # (partition, key prefix of its segments, topic id), one per topic-id directory
    # found: a topic deleted and created again under its name has two
    partitions: tuple[tuple[int, str, str], ...] = ()
    error: str | None = None


@dataclass(frozen=True)
class PartitionWork:
    topic: str
    partition: int
    directory: str
    read_times: bool


@dataclass(frozen=True)
class PartitionListing:
    topic: str
    partition: int
    segments: tuple[Segment, ...] = ()
    error: str | None = None


def batch_times(header: bytes) -> tuple[int, int]:
    """(baseTimestamp, maxTimestamp) of the record batch starting `header`; ValueError if none."""
    if len(header) < BATCH_HEADER_SIZE:
        raise ValueError(f"a record batch header is {BATCH_HEADER_SIZE} bytes, got {len(header)}")
    if header[_MAGIC_AT] != 2:
        raise ValueError(f"record batch magic {header[_MAGIC_AT]}, only v2 (magic 2) is read")
    base, maximum = _TIMES.unpack_from(header, _TIMES_AT)
    return int(base), int(maximum)


def s3_client(origin: OriginSpec) -> Any:
    import boto3
    from botocore.config import Config

    addressing = {"addressing_style": "path"} if origin.endpoint else {}
    return boto3.client(
        "s3", endpoint_url=origin.endpoint, region_name=origin.region,
        config=Config(s3=addressing, retries={"mode": "standard", "max_attempts": 3},
                      connect_timeout=5, read_timeout=30),
    )


def discover_topic(origin: OriginSpec, topic: str) -> TopicListing:
    """The partitions of `topic` under the plan's prefix (every topic-id directory of it)."""
    try:
        client = s3_client(origin)
        partitions: list[tuple[int, str, str]] = []
        for directory in _common_prefixes(client, origin.bucket, f"{origin.prefix}{topic}-"):
            # "orders-" also lists "orders-eu-<id>/": keep only "<topic>-<22-char id>/".
            topic_id = directory[len(origin.prefix) + len(topic) + 1:-1]
            if len(topic_id) != _TOPIC_ID_LENGTH or "/" in topic_id:
                continue
            for partition_dir in _common_prefixes(client, origin.bucket, directory):
                number = partition_dir[len(directory):-1]
                # ASCII digits only: str.isdigit takes "²", which int() refuses.
                if number.isascii() and number.isdigit() and str(int(number)) == number:
                    partitions.append((int(number), partition_dir, topic_id))
        return TopicListing(topic, tuple(sorted(partitions)))
    except Exception as exc:  # reported to the driver as a value
        return TopicListing(topic, error=describe_origin_error(exc, origin))


def list_partition(origin: OriginSpec, work: PartitionWork) -> PartitionListing:
    """The `.log` segments of one partition directory, with first-batch times if asked."""
    try:
        client = s3_client(origin)
        segments = []
        companions: dict[str, list[tuple[str, int]]] = {}  # .log key -> (key, size)
        paginator = client.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=origin.bucket, Prefix=work.directory):
            for item in page.get("Contents", ()):
                parsed = parse_aiven_key(item["Key"], origin.prefix)
                if (parsed is None or parsed.topic != work.topic
                        or parsed.partition != work.partition):
                    continue
                if parsed.suffix != "log":
                    companions.setdefault(parsed.with_suffix("log").key, []).append(
                        (item["Key"], int(item["Size"])))
                    continue
                segments.append(Segment(work.topic, work.partition, item["Key"],
                                        int(item["Size"]), parsed.start_offset))
        segments = [replace(s, companions=tuple(sorted(companions.get(s.key, ()))))
                    for s in segments]
        if work.read_times and segments:
            with ThreadPoolExecutor(max_workers=_HEADER_READERS) as pool:
                segments = list(pool.map(lambda s: _with_times(client, origin.bucket, s),
                                         segments))
        return PartitionListing(work.topic, work.partition, tuple(segments))
    except Exception as exc:  # reported to the driver as a value
        return PartitionListing(work.topic, work.partition,
                                error=describe_origin_error(exc, origin))


def _with_times(client: Any, bucket: str, segment: Segment) -> Segment:
    from botocore.exceptions import ClientError

    if segment.size < BATCH_HEADER_SIZE:
        return segment
    try:
        response = client.get_object(
            Bucket=bucket, Key=segment.key, Range=f"bytes=0-{BATCH_HEADER_SIZE - 1}"
        )
        body = response["Body"]
        try:
            # The header at most, whatever comes: a store that ignores Range
            # answers 200 with the whole segment (a gigabyte), left unread.
            header = body.read(BATCH_HEADER_SIZE)
        finally:
            body.close()
        base, maximum = batch_times(header)
    except (ClientError, ValueError):
        # Unreadable first batch: no time, so the selection keeps the segment.
        return segment
    return replace(segment, base_timestamp=base, max_timestamp=maximum)


def _common_prefixes(client: Any, bucket: str, prefix: str) -> list[str]:
    paginator = client.get_paginator("list_objects_v2")
    found: list[str] = []
    for page in paginator.paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        found.extend(item["Prefix"] for item in page.get("CommonPrefixes", ()))
    return found


def describe_origin_error(exc: Exception, origin: OriginSpec) -> str:
    """One line naming the plan field to look at, for botocore's errors."""
    from botocore.exceptions import (
        ClientError,
        EndpointConnectionError,
        NoCredentialsError,
    )

    where = origin.endpoint or "AWS S3"
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code == "NoSuchBucket":
            return f"origin.bucket: no such bucket {origin.bucket!r} at {where}"
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            return f"origin: access denied to s3://{origin.bucket} at {where} ({code})"
        return f"origin: s3://{origin.bucket} at {where} answered {code or exc}"
    if isinstance(exc, EndpointConnectionError):
        return f"origin.endpoint: cannot reach {where}: {exc}"
    if isinstance(exc, NoCredentialsError):
        return ("origin: no AWS credentials on the executor "
                "(set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in its environment)")
    return f"origin: listing s3://{origin.bucket} at {where} failed: {type(exc).__name__}: {exc}"
