"""`sidecar demo`: the embedded default that `make run` runs.

A local S3 server (moto on loopback) with bucket `tiered` holding genuine Kafka
log segments in the Aiven tiered-storage layout (each segment's `.log`,
`.indexes` and `.rsm-manifest`), and the sidecar in front of it. Its files live
in a directory of its own: the cache is removed when it stops, and what it asks
you to open (the access log, the example warm-up plan, the reports written
there) stays, named at the start and at the stop. A demo that never served
(a port taken, stopped while it started) leaves nothing.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import tempfile
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry

from sidecar.config import Config, load_config
from sidecar.server import Sidecar
from sidecar.tools.commands import DEMO_SPARK_CONF, program, python_module
from sidecar.tools.kafka_segments import aiven_segment_objects, generate_topic_segments
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3, loopback_client
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
    """Create the bucket and upload each segment's objects as Aiven's plugin does
    (`.log`, `.indexes`, `.rsm-manifest`); returns the keys written, in that order."""
    s3 = loopback_client(endpoint)
    s3.create_bucket(Bucket=BUCKET)
    keys = []
    for seed, topic in enumerate(topics):
        for segment in generate_topic_segments(
            topic=topic.name, partitions=topic.partitions,
            segments_per_partition=topic.segments_per_partition,
            segment_bytes=topic.segment_bytes, value_size=4096, seed=seed,
        ):
            for key, body in [(segment.key, segment.data), *aiven_segment_objects(segment)]:
                s3.put_object(Bucket=BUCKET, Key=key, Body=body)
                keys.append(key)
    return keys


def demo_config(
    endpoint: str, cache_dir: Path, listen: str, admin_listen: str,
    access_log: Path | None = None,
) -> Config:
    flags = {
        "origin_endpoint": endpoint, "cache_dir": str(cache_dir), "cache_size": "256MiB",
        "listen": listen, "admin_listen": admin_listen,
        # The demo's one bucket, as a fleet serves its tiered-storage bucket only.
        "access_buckets": BUCKET,
    }
    if access_log is not None:
        flags |= {"access_log": str(access_log), "node_name": "demo"}
    return load_config(flags, env={}, file_values={})


def _banner(sidecar: Sidecar, keys: list[str], run_dir: Path, warm_up: str) -> str:
    """Everything the demo has to say, once it serves; "Press Ctrl-C" is its last line."""
    by_suffix = {suffix: [key for key in keys if key.endswith("." + suffix)]
                 for suffix in ("log", "indexes", "rsm-manifest")}
    log_key = by_suffix["log"][0]
    manifest_key = by_suffix["rsm-manifest"][0]
    credentials = (f"AWS_ACCESS_KEY_ID={CREDENTIALS['AWS_ACCESS_KEY_ID']} "
                   f"AWS_SECRET_ACCESS_KEY={CREDENTIALS['AWS_SECRET_ACCESS_KEY']} \\")
    return "\n".join([
        "",
        "Kafka tiered-storage read sidecar: demo",
        f"  origin (local S3, moto):  {sidecar.config.origin.endpoint}  bucket '{BUCKET}'",
        f"  sidecar S3 endpoint:      {sidecar.data_url}",
        f"  live hit rates (browser): {sidecar.admin_url}/ui",
        f"  admin:                    {sidecar.admin_url}/api/v1/stats  "
        f"{sidecar.admin_url}/metrics",
        f"  {len(by_suffix['log'])} genuine Kafka segments, e.g. {log_key}",
        f"  each with its .indexes and .rsm-manifest, e.g. {manifest_key}",
        "  (a segment's manifest and indexes enter the cache's main queue at once,",
        "  so reading through many segments does not evict them)",
        "",
        "Read a range through the sidecar (the demo's credentials sign it):",
        f"  {credentials}",
        f"  aws s3api get-object --endpoint-url {sidecar.data_url} --bucket {BUCKET} \\",
        f"    --key {log_key} --range bytes=0-1048575 {run_dir / 'first-mib.bin'}",
        "",
        "Hit rates, origin traffic and the cache in the terminal:",
        f"  {program('sidecar')} stats --admin {sidecar.admin_url}",
        "",
        "Hit ratios per topic and the cache size for 99% hits, from this demo's access "
        "log (Spark):",
        f"  {python_module('spark_warmup.capacity')} {DEMO_SPARK_CONF} "
        f"--logs {sidecar.config.server.access_log} --report {run_dir / 'capacity-report'}",
        f"  (then open {run_dir / 'capacity-report' / 'report.html'})",
        "",
        warm_up,
        "",
        f"Demo files: {run_dir} (its cache is removed when the demo stops; the access "
        "log, the warm-up plan and the reports written there stay)",
        "Press Ctrl-C to stop.",
    ])


async def run_demo(listen: str, admin_listen: str, seconds: float | None) -> None:
    for name, value in CREDENTIALS.items():
        os.environ.setdefault(name, value)
    # SIGTERM while it starts (filling the bucket takes seconds) ends the start as
    # Ctrl-C does (asyncio.run cancels the task on SIGINT), so that the cleanup below
    # runs: by default SIGTERM ends the process at once, leaving the cache and the
    # local S3 behind. Once serving, `_serve` makes it a stop like any other.
    task = asyncio.current_task()
    assert task is not None
    terminated = asyncio.Event()

    def terminate() -> None:
        terminated.set()
        task.cancel()

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, terminate)
    # One directory per run, so that two demos never share or overwrite a file. The
    # cache goes when the demo stops; what it asked you to open stays.
    run_dir = Path(tempfile.mkdtemp(prefix="sidecar-demo-"))
    cache = run_dir / "cache"
    cache.mkdir()
    served = asyncio.Event()
    try:
        await _serve(run_dir, cache, listen, admin_listen, seconds, served)
    except asyncio.CancelledError:
        if not terminated.is_set():
            raise
        # Stopped before it served: as a stop once serving, not a failure.
    finally:
        if served.is_set():
            shutil.rmtree(cache, ignore_errors=True)
            print(f"Kept after the demo: {run_dir} (access log, warm-up plan and reports; "
                  "the cache was removed)", flush=True)
        else:
            # Never served (a port taken, stopped while starting): nothing in it was
            # named to anyone, and a retry would leave one more directory each time.
            shutil.rmtree(run_dir, ignore_errors=True)


async def _serve(run_dir: Path, cache: Path, listen: str, admin_listen: str,
                 seconds: float | None, served: asyncio.Event) -> None:
    with LocalS3() as origin:
        loop = asyncio.get_running_loop()
        keys = await loop.run_in_executor(None, seed_bucket, origin.endpoint)
        sidecar = Sidecar(
            demo_config(origin.endpoint, cache, listen, admin_listen,
                        access_log=run_dir / "access.log"),
            CollectorRegistry()
        )
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        try:
            await sidecar.start()
            # The token the sidecar generated into its cache dir guards the warm calls.
            plan = example_plan(origin.endpoint, BUCKET, sidecar.admin_url,
                                [(topic.name, topic.partitions) for topic in DEMO_TOPICS],
                                admin_token_file=sidecar.admin_token_file)
            plan_path = run_dir / "warmup-plan.json"
            plan_path.write_text(json.dumps(plan, indent=2) + "\n")
            warm_up = example_instructions(str(plan_path), plan, sidecar.data_url, CREDENTIALS,
                                           report_dir=str(run_dir / "warmup-report"))
            print(_banner(sidecar, keys, run_dir, warm_up), flush=True)
            served.set()
            try:
                await asyncio.wait_for(stop.wait(), timeout=seconds)
            except TimeoutError:
                pass
        finally:
            await sidecar.stop()
