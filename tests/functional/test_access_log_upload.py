"""Rotated access logs shipped to the object store (`access_log_upload`), against
moto's S3 server on loopback and the sidecar as a real process: every line of
every request arrives once, in order, under PREFIX/NODE/, where the capacity
analysis' own reader finds them; an origin that refuses the uploads costs
nothing but retries, and they go through once it takes them.
"""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.local_s3 import LocalS3
from spark_warmup.capacity.sources import Split, expand, read_split
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

NODE = "broker-7"
READS = 24


def start(origin: str, tmp_path: Path, log_bucket: str) -> SidecarProcess:
    cache = tmp_path / "cache"
    cache.mkdir()
    return SidecarProcess(origin, cache, "--access-log", str(tmp_path / "access.jsonl"), env={
        # About five lines a file: a handful of rotations, all of which may wait.
        "SIDECAR_ACCESS_LOG_MAX_SIZE": "2KiB", "SIDECAR_ACCESS_LOG_BACKUPS": "8",
        "SIDECAR_ACCESS_LOG_UPLOAD": f"s3://{log_bucket}/fleet/access/",
        "SIDECAR_NODE_NAME": NODE,
    })


def read_all(sidecar: SidecarProcess, bucket: str, key: str) -> list[str]:
    """GET the object READS times; the request ids the sidecar answered with."""
    ids = []
    for _ in range(READS):
        with urllib.request.urlopen(f"{sidecar.data_url}/{bucket}/{key}", timeout=10) as answer:
            answer.read()
            ids.append(answer.headers["x-amz-request-id"])
    return ids


def shipped(s3: Any, bucket: str) -> list[str]:
    listing = s3.list_objects_v2(Bucket=bucket, Prefix="fleet/access/")
    return sorted(item["Key"] for item in listing.get("Contents", ()))


def test_every_line_is_shipped_once_in_order_where_the_capacity_job_reads(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="orders-0/segment.log", Body=b"k" * 3000)
    with start(local_s3.endpoint, tmp_path, bucket) as sidecar:
        ids = read_all(sidecar, bucket, "orders-0/segment.log")
        # Files rotated while serving go up while it serves.
        eventually(lambda: sidecar.metric("sidecar_access_log_uploads_total", outcome="ok") >= 2,
                   "rotated files shipped while serving")
        assert sidecar.metric("sidecar_access_log_uploads_total", outcome="dropped") == 0
    # The stop rotated the live file out and shipped it too.
    assert sidecar.stop() == 0
    keys = shipped(origin_s3, bucket)
    assert len(keys) >= 3 and all(k.startswith(f"fleet/access/{NODE}/") for k in keys), keys
    lines = [line for key in keys for line in
             origin_s3.get_object(Bucket=bucket, Key=key)["Body"].read().decode().splitlines()]
    assert [json.loads(line)["request_id"] for line in lines] == ids
    assert all(json.loads(line)["node"] == NODE for line in lines)
    assert (tmp_path / "access.jsonl").read_text() == ""

    # python -m spark_warmup.capacity --logs s3://BUCKET/fleet/access/ reads them all.
    monkeypatch.setenv("AWS_ENDPOINT_URL", local_s3.endpoint)
    splits, missing = expand([f"s3://{bucket}/fleet/access/"], s3=origin_s3)
    assert missing == [] and sorted(split.path for split in splits) == keys
    read: list[str] = []
    for split in sorted(splits, key=lambda s: s.path):
        assert isinstance(split, Split)
        read += [line for line in read_split(split) if isinstance(line, str)]
    assert [line.rstrip("\n") for line in read] == lines


def test_refused_uploads_are_tried_again_and_serving_goes_on(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path,
) -> None:
    origin_s3.put_object(Bucket=bucket, Key="orders-0/segment.log", Body=b"k" * 3000)
    logs = bucket + "-logs"  # not there yet: every upload is refused
    with start(local_s3.endpoint, tmp_path, logs) as sidecar:
        ids = read_all(sidecar, bucket, "orders-0/segment.log")
        eventually(lambda: sidecar.metric("sidecar_access_log_uploads_total",
                                          outcome="failed") >= 1, "a refused upload")
        assert sidecar.metric("sidecar_access_log_uploads_total", outcome="ok") == 0
        # Reads never waited for it, nor did a refused upload open the breaker.
        assert sidecar.metric("sidecar_origin_breaker_state", state="closed") == 1
        assert len(read_all(sidecar, bucket, "orders-0/segment.log")) == READS
        origin_s3.create_bucket(Bucket=logs)
        eventually(lambda: sidecar.metric("sidecar_access_log_uploads_total", outcome="ok")
                   >= 1, "the upload that was refused, once the bucket is there", timeout=30)
        assert sidecar.alive()
    first = origin_s3.get_object(Bucket=logs, Key=shipped(origin_s3, logs)[0])
    assert json.loads(first["Body"].read().decode().splitlines()[0])["request_id"] == ids[0]
