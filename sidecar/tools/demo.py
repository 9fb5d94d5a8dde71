"""`sidecar demo`: the embedded default that `make run` runs.

A local S3 server (moto on loopback) with bucket `tiered` holding genuine Kafka
log segments in the Aiven tiered-storage layout, and the sidecar in front of it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

import boto3
from prometheus_client import CollectorRegistry

from sidecar.config import Config, load_config
from sidecar.server import Sidecar
from sidecar.tools.kafka_segments import generate_topic_segments
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from sidecar.tools.warmup_example import example_instructions, example_plan

log = logging.getLogger(__name__)

BUCKET = "tiered"


@dataclass(frozen=True)
class DemoTopic:
    name: str
    partitions: int
    segments_per_partition: int
    segment_bytes: int


DEMO_TOPICS = (
    DemoTopic("orders", partitions=2, segments_per_partition=3, segment_bytes=20 * 1024 * 1024),
    DemoTopic("clicks", partitions=2, segments_per_partition=2, segment_bytes=6 * 1024 * 1024),
)


def seed_bucket(endpoint: str, topics: tuple[DemoTopic, ...] = DEMO_TOPICS) -> list[str]:
    """Create the bucket and upload the segments; returns the keys written."""
    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    keys = []
    for seed, topic in enumerate(topics):
        for segment in generate_topic_segments(
            topic=topic.name, partitions=topic.partitions,
            segments_per_partition=topic.segments_per_partition,
            segment_bytes=topic.segment_bytes, value_size=4096, seed=seed,
        ):
            s3.put_object(Bucket=BUCKET, Key=segment.key, Body=segment.data)
            keys.append(segment.key)
    return keys


def demo_config(
    endpoint: str, cache_dir: Path, listen: str, admin_listen: str
) -> Config:
    return load_config(
        {
            "origin_endpoint": endpoint, "cache_dir": str(cache_dir), "cache_size": "256MiB",
            "listen": listen, "admin_listen": admin_listen,
        },
        env={}, file_values={},
    )


def _banner(sidecar: Sidecar, keys: list[str]) -> str:
    key = keys[0]
    return "\n".join([
        "",
        "Kafka tiered-storage read sidecar: demo",
        f"  origin (local S3, moto):  {sidecar.config.origin.endpoint}  bucket '{BUCKET}'",
        f"  sidecar S3 endpoint:      {sidecar.data_url}",
        f"  admin:                    {sidecar.admin_url}/api/v1/stats  "
        f"{sidecar.admin_url}/metrics",
        f"  {len(keys)} genuine Kafka segments, e.g. {key}",
        "",
        "Read a range through the sidecar (any credentials work against the demo):",
        f"  AWS_ACCESS_KEY_ID={CREDENTIALS['AWS_ACCESS_KEY_ID']} "
        f"AWS_SECRET_ACCESS_KEY={CREDENTIALS['AWS_SECRET_ACCESS_KEY']} \\",
        f"  aws s3api get-object --endpoint-url {sidecar.data_url} --bucket {BUCKET} \\",
        f"    --key {key} --range bytes=0-1048575 /tmp/first-mib.bin",
        "",
        "Press Ctrl-C to stop.",
        "",
    ])


async def run_demo(listen: str, admin_listen: str, seconds: float | None) -> None:
    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    with LocalS3() as origin, tempfile.TemporaryDirectory(prefix="sidecar-demo-") as cache:
        loop = asyncio.get_running_loop()
        keys = await loop.run_in_executor(None, seed_bucket, origin.endpoint)
        sidecar = Sidecar(
            demo_config(origin.endpoint, Path(cache), listen, admin_listen), CollectorRegistry()
        )
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await sidecar.start()
            print(_banner(sidecar, keys), flush=True)
            plan = example_plan(origin.endpoint, BUCKET, sidecar.admin_url,
                                [(topic.name, topic.partitions) for topic in DEMO_TOPICS])
            plan_path = Path(tempfile.gettempdir()) / "sidecar-demo-warmup-plan.json"
            plan_path.write_text(json.dumps(plan, indent=2) + "\n")
            print(example_instructions(str(plan_path), plan, sidecar.data_url, CREDENTIALS),
                  flush=True)
            try:
                await asyncio.wait_for(stop.wait(), timeout=seconds)
            except TimeoutError:
                pass
        finally:
            await sidecar.stop()
