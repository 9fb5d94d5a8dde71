"""Scenario `broker`: consumers catching up through a real Kafka broker, side by side.

One Apache Kafka broker (KRaft, sidecar/tools/broker.py) with tiered storage on,
its remote storage manager the stand-in for Aiven's plugin (tests/kafka/src:
Aiven's object layout and S3 request pattern). Topic `catchup` has four
partitions of known records (sidecar/tools/catch_up.py) tiered to remote
storage; topic `catchup-local` holds the same records and is never tiered.
Each row restarts the broker with its remote storage manager pointed at that
row's endpoint, then a fresh consumer reads every partition from offset 0 and
checks every record:

  direct        the manager straight to the origin emulator
  plugin-cache  the manager with its disk chunk cache (the stand-in for the
                plugin's DiskChunkCache, prefetching 16 MiB past each miss as
                the plugin's README configures it)
  sidecar-cold  the manager to a fresh sidecar in front of the origin emulator
  sidecar-warm  the same, to a fresh sidecar first warmed with bench/warmup.py's
                warm-up of the topic (the Spark job, else direct warm calls)
  sidecar-warm-1m
                `catchup-1m`, the same records tiered with the manager's
                `chunk.size` at 1 MiB, to a fresh sidecar warmed with direct warm
                calls of its objects: what a smaller chunk saves the broker when a
                sidecar, not the object store, answers its chunk reads
  local         `catchup-local` from the broker's own log (the ceiling)

The origin emulator (bench/nginx.py) serves static files, so it cannot take the
broker's uploads: the data is tiered first with the manager writing to moto
(sidecar/tools/local_s3.py), and the bucket is then copied into a directory
the emulator serves as `/{bucket}/{key}`. The remote log metadata stays in
the broker's own topic across restarts; the broker's on-disk cache of remote
indexes (`remote-log-index-cache` in its log directory) is removed at every
restart, so each row fetches the indexes through its own endpoint, as a
broker catching up on segments it has not read does.

Signing: the manager signs every request (SigV4) with the plugin's key. The
origin emulator ignores signatures; the sidecar checks them (its secure
default) and is given the plugin's key with SIDECAR_AUTH_KEYS.

Per row: the consumer's MB/s (record values), the poll latency of the
consumer's fetches, the broker's, the sidecar's and the consumer's (this
process's) CPU-seconds per GiB of values from /proc (bench/cpu.py), the
origin's GETs and body bytes (its access log), and the requests the manager
sent to its endpoint and those that reached the origin (bench/request_pattern.py:
the sidecar's access log, the origin's access log), with the connections they
came over (bench/connections.py for the manager's; nginx's serials at the origin).
"""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench import cpu
from bench.clients import ClientFailed
from bench.connections import ConnectionSampler
from bench.dataset import Dataset, DatasetSpec, StoredObject, write_listings
from bench.harness import Bench
from bench.nginx import NginxServer, origin_config, origin_traffic
from bench.probe import foreign_cpu, read_process_times
from bench.request_pattern import origin_requests, sidecar_requests, summarize
from bench.sidecar_server import SidecarServer, stats_delta
from bench.warmup import SparkUnusable, spark_available, warm_directly, warm_plan, warm_with_spark
from sidecar.config import parse_size
from sidecar.layout import parse_aiven_key
from sidecar.tools.broker import (
    TIERED_TOPIC,
    BrokerError,
    KafkaCluster,
    RemoteStorage,
    kafka_version,
)
from sidecar.tools.catch_up import CatchUpError, catch_up, produce

SCENARIO = "broker"
MiB = 1024 * 1024
BUCKET = "tiered"
TOPIC = "catchup"
LOCAL_TOPIC = "catchup-local"
#: The same records tiered with SMALL_CHUNK_BYTES chunks (the broker restarted with it).
SMALL_CHUNK_TOPIC = "catchup-1m"
PARTITIONS = 4
#: Record values of 8 KiB, as the replay data set's: the consumer's per-record
#: Python work stays small beside the bytes.
RECORD_BYTES = 8192
#: Records past the segments wanted in remote storage, so that the last of them
#: is closed (and tiered) and the active segment, which stays local, is small.
TAIL_RECORDS = 64
#: The plugin's chunk size (its README's example) and the prefetch its README
#: configures for the disk chunk cache.
CHUNK_BYTES = 4 * MiB
PREFETCH_BYTES = 16 * MiB
SMALL_CHUNK_BYTES = 1 * MiB
PLUGIN_KEY, PLUGIN_SECRET = "tiered-storage-plugin", "plugin-secret-0123456789"
BROKER_HEAP = "1g"
#: The broker's cache of remote indexes in its log directory (Kafka's RemoteIndexCache).
INDEX_CACHE = "remote-log-index-cache"
#: A restarted broker answers remote reads only once its remote log metadata manager
#: has read the metadata topic again (until then fetches fail with "Remote log
#: metadata cache is not initialized"); its ConsumerTask says so at INFO.
METADATA_LOGGER = "org.apache.kafka.server.log.remote.metadata.storage.ConsumerTask"
METADATA_READY = "Initialized for all the"
STARTED = "Kafka Server started"
CHUNK_CACHE_SETTINGS = "rsm.config.chunk.cache."
TIERING_TIMEOUT_S = 300.0
READY_TIMEOUT_S = 90.0
#: The rows, in the order they run: (run key, label).
VARIANTS = (("local", "local"), ("direct", "direct"), ("plugin_cache", "plugin-cache"),
            ("sidecar_cold", "sidecar-cold"), ("sidecar_warm", "sidecar-warm"),
            ("sidecar_warm_tier", "sidecar-warm-tier"), ("sidecar_warm_1m", "sidecar-warm-1m"))
#: The memory tier of the `sidecar_warm_tier` row: the default share of the
#: cache, several times smaller than what the consumer reads.
TIER_ENV = {"SIDECAR_MEMORY_TIER": "auto"}


class Setup:
    """The broker with both topics written, and the tiered bucket as files."""

    def __init__(self, bench: Bench, cluster: KafkaCluster, root: Path, count: int,
                 objects: list[StoredObject], topic_id: str) -> None:
        self.cluster = cluster
        self.root = root  # {root}/{BUCKET}/{key}
        self.count = count  # records per partition, in each topic
        self.objects = objects
        spec = DatasetSpec(SCENARIO, PARTITIONS, 0, bench.settings.broker_segment_bytes,
                           RECORD_BYTES, topic=TOPIC, bucket=BUCKET)
        # The origin emulator's listings (ListBuckets, the Spark job's ListObjectsV2).
        self.dataset = Dataset(root, spec, topic_id, tuple(objects))
        self.listings = bench.work / "listings-broker"
        self.by_raw = write_listings(self.dataset, self.listings)

    @property
    def logs(self) -> list[StoredObject]:
        """The tiered `.log` objects of TOPIC."""
        return [item for item in self.of_topic(TOPIC) if item.key.endswith(".log")]

    def of_topic(self, topic: str) -> list[StoredObject]:
        """Every object (log, indexes, manifest) of one topic's segments."""
        return [item for item in self.objects
                if (key := parse_aiven_key(item.key)) is not None and key.topic == topic]

    @property
    def remote_log_bytes(self) -> int:
        return sum(item.size for item in self.logs)


def records_per_partition(remote_bytes: int, segment_bytes: int) -> int:
    """Records of RECORD_BYTES a partition needs so that its share of `remote_bytes`
    fills whole closed segments, with the active one just begun."""
    segments = max(1, remote_bytes // PARTITIONS // segment_bytes)
    return math.ceil(segments * segment_bytes / RECORD_BYTES) + TAIL_RECORDS


def _catch_up_timeout(value_bytes: int) -> float:
    # Generous: a catch-up slower than 2 MB/s is broken, not slow.
    return 120.0 + value_bytes / 2e6


# --- the broker ---------------------------------------------------------------------------


def _create_topics(cluster: KafkaCluster, segment_bytes: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        admin.create_topics([
            NewTopic(TOPIC, PARTITIONS, 1, topic_configs={
                **TIERED_TOPIC, "segment.bytes": str(segment_bytes)}),
            NewTopic(SMALL_CHUNK_TOPIC, PARTITIONS, 1, topic_configs={
                **TIERED_TOPIC, "segment.bytes": str(segment_bytes)}),
            NewTopic(LOCAL_TOPIC, PARTITIONS, 1, topic_configs={
                "remote.storage.enable": "false", "segment.bytes": str(segment_bytes),
                "retention.ms": "-1", "retention.bytes": "-1"}),
        ])
    finally:
        admin.close()


def _copy_bucket(client: Any, root: Path) -> tuple[list[StoredObject], str]:
    """Every object of the bucket into `root/BUCKET/key`; the objects and the topic id."""
    objects = []
    topic_id = ""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for item in page.get("Contents", ()):
            key = parse_aiven_key(item["Key"])
            if key is None:
                continue
            path = root / BUCKET / item["Key"]
            path.parent.mkdir(parents=True, exist_ok=True)
            body = client.get_object(Bucket=BUCKET, Key=item["Key"])["Body"]
            with open(path, "wb") as out:
                shutil.copyfileobj(body, out, 1024 * 1024)
            topic_id = key.topic_id
            objects.append(StoredObject(item["Key"], path.stat().st_size, key.partition,
                                        key.start_offset, key.start_offset))
    return objects, topic_id


def _prepare(bench: Bench, stack: ExitStack) -> Setup:
    """Start the broker against moto, write both topics, tier one, copy the bucket out."""
    from sidecar.tools.local_s3 import LocalS3, loopback_client

    settings = bench.settings
    segment = settings.broker_segment_bytes
    count = records_per_partition(settings.broker_remote_bytes, segment)
    work = bench.workdir("broker")
    root = work / "origin-files"
    with LocalS3() as s3:
        client = loopback_client(s3.endpoint, key=PLUGIN_KEY, secret=PLUGIN_SECRET)
        try:
            client.create_bucket(Bucket=BUCKET)
            storage = RemoteStorage(s3.endpoint, BUCKET, PLUGIN_KEY, PLUGIN_SECRET,
                                    chunk_size=CHUNK_BYTES)
            cluster = stack.enter_context(KafkaCluster(work / "kafka", storage,
                                                       heap=BROKER_HEAP))
            log_metadata_readiness(cluster)
            _create_topics(cluster, segment)
            started = time.monotonic()
            for topic in (TOPIC, LOCAL_TOPIC):
                print(f"  {SCENARIO}: producing {count:,} records of {RECORD_BYTES} B to each "
                      f"of {PARTITIONS} partitions of {topic} ...", file=sys.stderr, flush=True)
                produce(cluster.bootstrap, topic, range(PARTITIONS), count, RECORD_BYTES)
            produced = time.monotonic() - started
            cluster.await_tiered(client, BUCKET, TOPIC, range(PARTITIONS), TIERING_TIMEOUT_S)
            tiered = time.monotonic() - started - produced
            # The same records again, tiered by a manager whose chunks are 1 MiB.
            restart_broker(cluster, RemoteStorage(s3.endpoint, BUCKET, PLUGIN_KEY, PLUGIN_SECRET,
                                                  chunk_size=SMALL_CHUNK_BYTES).properties())
            produce(cluster.bootstrap, SMALL_CHUNK_TOPIC, range(PARTITIONS), count, RECORD_BYTES)
            cluster.await_tiered(client, BUCKET, SMALL_CHUNK_TOPIC, range(PARTITIONS),
                                 TIERING_TIMEOUT_S)
            objects, topic_id = _copy_bucket(client, root)
        finally:
            client.close()
    setup = Setup(bench, cluster, root, count, objects, topic_id)
    info = bench.scenarios[SCENARIO]
    info.update({
        "records_per_partition": count,
        "value_bytes": count * PARTITIONS * RECORD_BYTES,
        "remote_log_bytes": setup.remote_log_bytes,
        "remote_segments": len(setup.logs),
        "objects": len(objects),
        "produce_seconds": round(produced, 1), "tiering_seconds": round(tiered, 1),
    })
    print(f"  {SCENARIO}: {len(setup.logs)} segments, {setup.remote_log_bytes / MiB:.0f} MiB "
          f"in remote storage (produced in {produced:.0f} s, tiered {tiered:.0f} s later)",
          file=sys.stderr, flush=True)
    return setup


def rewrite_properties(path: Path, settings: dict[str, str]) -> None:
    """`settings` in place of the file's remote storage settings; the chunk cache's
    are dropped unless given."""
    props = {}
    for line in path.read_text().splitlines():
        key, sep, value = line.partition("=")
        if sep and not key.startswith(CHUNK_CACHE_SETTINGS):
            props[key] = value
    props.update(settings)
    path.write_text("".join(f"{key}={value}\n" for key, value in props.items()))


def log_metadata_readiness(cluster: KafkaCluster) -> None:
    """Have the broker log when its remote log metadata is loaded (from its next start)."""
    config = cluster.workdir / "log4j2.properties"
    with open(config, "a") as out:
        out.write(f"logger.metadata.name = {METADATA_LOGGER}\nlogger.metadata.level = info\n")


def restart_broker(cluster: KafkaCluster, settings: dict[str, str]) -> None:
    """The broker again, with `settings` and without its cache of remote indexes, once
    it can serve remote reads."""
    node = cluster.nodes[0]
    before = node.log_text()
    cluster.stop()
    shutil.rmtree(node.data / INDEX_CACHE, ignore_errors=True)
    rewrite_properties(node.directory / "server.properties", settings)
    cluster.restart(node)
    # This start's own line (restart() awaits it too), and its remote log metadata.
    deadline = time.monotonic() + READY_TIMEOUT_S
    for line in (STARTED, METADATA_READY):
        while node.log_text().count(line) <= before.count(line):
            if time.monotonic() > deadline:
                raise BrokerError(f"the broker did not log {line!r} within "
                                  f"{READY_TIMEOUT_S:g} s of a restart")
            time.sleep(0.1)


# --- one row ------------------------------------------------------------------------------


def _origin(bench: Bench, setup: Setup, name: str) -> NginxServer:
    prefix = bench.workdir(f"origin-{name}")
    return NginxServer(f"origin ({name})", prefix, lambda port: origin_config(
        prefix, port, setup.root, setup.listings, setup.by_raw, bucket=BUCKET))


def _storage(endpoint: str, chunk_bytes: int = CHUNK_BYTES) -> dict[str, str]:
    # chunk.size shapes uploads (the manifest's chunk index); reads follow each manifest.
    return RemoteStorage(endpoint, BUCKET, PLUGIN_KEY, PLUGIN_SECRET,
                         chunk_size=chunk_bytes).properties()


def _read_from(path: Path, offset: int) -> tuple[list[str], int]:
    """The whole lines of `path` after byte `offset`, and the offset after them."""
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            data = log.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1
    return data[:end].decode(errors="replace").splitlines(), offset + end


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _catch_up(setup: Setup, label: str, topic: str, origin: NginxServer,
              endpoint_port: int | None, sidecar: SidecarServer | None,
              access_log: Path | None) -> dict[str, Any]:
    """One fresh consumer from offset 0 to the end of every partition, measured."""
    from kafka.errors import KafkaError

    cluster = setup.cluster
    broker_pid = cluster.nodes[0].pid
    expected = setup.count * PARTITIONS
    origin_offset = _size(origin.access_log)
    log_offset = _size(access_log) if access_log else 0
    stats_before = sidecar.stats() if sidecar else None
    broker_before = cpu.usage(broker_pid)
    broker_threads = cpu.threads(broker_pid)
    sidecar_before = cpu.usage(sidecar.pid) if sidecar and sidecar.pid else None
    own_before = os.times()
    processes = read_process_times()
    timeout = _catch_up_timeout(expected * RECORD_BYTES)
    print(f"  {SCENARIO}/{label}: catching up on {expected:,} records of {topic} ...",
          file=sys.stderr, flush=True)
    with ExitStack() as stack:
        sampler = (stack.enter_context(ConnectionSampler(endpoint_port))
                   if endpoint_port else None)
        try:
            done = catch_up(cluster.bootstrap, topic, range(PARTITIONS), setup.count,
                            RECORD_BYTES, timeout_s=timeout)
        except (CatchUpError, KafkaError) as exc:
            raise ClientFailed(f"{label}: the catch-up failed: {exc}") from exc
    broker_used = cpu.usage(broker_pid) - broker_before
    by_thread = cpu.by_kind(broker_threads, cpu.threads(broker_pid), done.value_bytes)
    sidecar_used = (cpu.usage(sidecar.pid) - sidecar_before
                    if sidecar and sidecar.pid and sidecar_before else None)
    own = os.times()
    # On a shared machine: how much CPU processes outside this run took meanwhile.
    others = foreign_cpu(processes, read_process_times(), os.getpid(), done.seconds)
    own_used = cpu.Usage(own.user - own_before.user, own.system - own_before.system, 0)
    time.sleep(0.5)  # nginx's lines of closed connections, the sidecar's log writer
    traffic, _ = origin_traffic(origin.access_log, origin_offset)
    origin_lines, _ = _read_from(origin.access_log, origin_offset)
    fetches = sorted(done.fetch_seconds)
    row: dict[str, Any] = {
        "topic": topic,
        "records": done.records, "records_expected": expected,
        "verified": done.records == expected,
        "value_bytes": done.value_bytes, "bytes": done.value_bytes,
        "seconds": round(done.seconds, 3), "mb_per_s": round(done.mb_per_s, 1),
        "fetch_errors": done.fetch_errors, "polls": len(fetches),
        "fetch_latency_ms": {
            "p50": round(1000 * fetches[len(fetches) // 2], 1) if fetches else None,
            "p99": round(1000 * done.fetch_p99(), 1),
            "max": round(1000 * fetches[-1], 1) if fetches else None},
        "broker_cpu_per_gib": broker_used.per_gib(done.value_bytes),
        # Java's thread names (as the kernel has them, 15 characters) less their numbers;
        # the launcher's main thread, idle, is the one cpu.by_kind calls the event loop.
        "broker_threads_per_gib": {("main" if kind == "event-loop" else kind): figures["cpu_s"]
                                   for kind, figures in by_thread.items()},
        "consumer_cpu_per_gib": own_used.per_gib(done.value_bytes),
        "origin_traffic": asdict(traffic),
        "origin_body_bytes_per_consumed_byte": (
            traffic.body_bytes / done.value_bytes if done.value_bytes else None),
        "origin_pattern": summarize(origin_requests(origin_lines, BUCKET)),
        "foreign_cpu": others,
    }
    if sidecar_used is not None:
        row["sidecar_cpu_per_gib"] = sidecar_used.per_gib(done.value_bytes)
    if sidecar is not None and stats_before is not None:
        row["sidecar"] = stats_delta(stats_before, sidecar.stats())
        # Since the sidecar started (the warm-up included): hits, misses, inserts, evictions.
        row["memory_tier"] = {name: (sidecar.metric_samples(
            f"sidecar_memory_tier_{name}_total") or {}).get("", 0)
            for name in ("hits", "misses", "inserts", "evictions")}
    connections = sampler.count if sampler else None
    if access_log is not None:
        lines, _ = _read_from(access_log, log_offset)
        row["endpoint_pattern"] = summarize(sidecar_requests(lines), connections)
    elif endpoint_port is not None:  # the manager spoke to the origin itself
        row["endpoint_pattern"] = summarize(origin_requests(origin_lines, BUCKET), connections)
    per_gib = row["broker_cpu_per_gib"].get("total")
    print(f"  {SCENARIO}/{label}: {row['mb_per_s']} MB/s, fetch p99 "
          f"{row['fetch_latency_ms']['p99']} ms, broker {per_gib} CPU-s/GiB, origin "
          f"{traffic.get_requests} GETs {traffic.body_bytes / MiB:.0f} MiB, other processes "
          f"{others['cores']:.2f} cores", file=sys.stderr, flush=True)
    return row


@contextmanager
def _sidecar(bench: Bench, origin: NginxServer, name: str,
             extra_env: dict[str, str] | None = None) -> Iterator[tuple[SidecarServer, Path]]:
    """A fresh sidecar that accepts the plugin's key and logs every request."""
    prefix = bench.workdir(f"sidecar-{name}")
    access_log = prefix / "access.log"
    env = {"SIDECAR_AUTH_KEYS": f"{PLUGIN_KEY}:{PLUGIN_SECRET}",
           "SIDECAR_ACCESS_LOG": str(access_log), **(extra_env or {})}
    server = SidecarServer(origin.url, prefix / "cache", prefix,
                           bench.settings.sidecar_cache_size, (), env)
    with server:
        yield server, access_log
    shutil.rmtree(prefix / "cache", ignore_errors=True)


def _warm(bench: Bench, setup: Setup, origin: NginxServer,
          sidecar: SidecarServer) -> dict[str, Any]:
    """bench/warmup.py's warm-up of the topic: the Spark job, else direct warm calls."""
    info = bench.scenarios[SCENARIO]
    available, why_not = spark_available()
    info["spark_unavailable_reason"] = why_not or None
    work = bench.workdir("broker-warmup")
    started = time.monotonic()
    result: dict[str, Any] | None = None
    if available:
        plan = warm_plan(bench, origin, sidecar, bucket=BUCKET, topic=TOPIC)
        try:
            result = warm_with_spark(bench, origin, sidecar, work, plan, f"{SCENARIO}-warm")
        except SparkUnusable as exc:
            info["spark_failure"] = str(exc)[-2000:]
            print(f"  {SCENARIO}: the Spark job could not run, warming directly: "
                  f"{str(exc)[-300:]}", file=sys.stderr, flush=True)
    if result is None:
        result = warm_directly(bench, sidecar, setup.logs, BUCKET, f"{SCENARIO}-warm")
    result["seconds"] = round(time.monotonic() - started, 2)
    if result.get("failed_segments"):
        raise ClientFailed(f"the warm-up failed for {result['failed_segments']} segments")
    print(f"  {SCENARIO}: warmed via {result['via']} in {result['seconds']} s "
          f"({(result.get('bytes_fetched') or 0) / MiB:.0f} MiB fetched)", file=sys.stderr,
          flush=True)
    return result


def _row(bench: Bench, setup: Setup, run: str, label: str) -> dict[str, Any]:
    with ExitStack() as stack:
        origin = stack.enter_context(_origin(bench, setup, label))
        settings = _storage(origin.url)
        sidecar: SidecarServer | None = None
        access_log: Path | None = None
        endpoint_port: int | None = origin.port
        warmed: dict[str, Any] | None = None
        if run == "plugin_cache":
            settings.update({
                f"{CHUNK_CACHE_SETTINGS}path": str(bench.workdir("plugin-chunk-cache")),
                f"{CHUNK_CACHE_SETTINGS}size": str(parse_size(bench.settings.sidecar_cache_size)),
                f"{CHUNK_CACHE_SETTINGS}prefetch.max.size": str(PREFETCH_BYTES),
            })
        elif run.startswith("sidecar"):
            sidecar, access_log = stack.enter_context(_sidecar(
                bench, origin, label, TIER_ENV if run == "sidecar_warm_tier" else None))
            if run in ("sidecar_warm", "sidecar_warm_tier"):
                warmed = _warm(bench, setup, origin, sidecar)
            elif run == "sidecar_warm_1m":
                warmed = warm_directly(bench, sidecar, setup.of_topic(SMALL_CHUNK_TOPIC), BUCKET,
                                       f"{SCENARIO}-warm-1m")
            if warmed is not None:
                warmed["origin_traffic"] = asdict(origin_traffic(origin.access_log)[0])
            settings = _storage(sidecar.data_url,
                                SMALL_CHUNK_BYTES if run == "sidecar_warm_1m" else CHUNK_BYTES)
            endpoint_port = urlsplit(sidecar.data_url).port
        elif run == "local":
            endpoint_port = None
        restart_broker(setup.cluster, settings)
        topic = {"local": LOCAL_TOPIC, "sidecar_warm_1m": SMALL_CHUNK_TOPIC}.get(run, TOPIC)
        row = _catch_up(setup, label, topic, origin, endpoint_port, sidecar, access_log)
        row["remote_storage_settings"] = {
            key: value for key, value in settings.items()
            if key.startswith(CHUNK_CACHE_SETTINGS) or key.endswith("endpoint.url")}
        if warmed is not None:
            row["warm_up"] = warmed
        return row


def _kafka_version() -> str:
    try:
        return kafka_version()
    except BrokerError:
        return "?"


def _java_version() -> str:
    """`java -version`'s first line, e.g. 'openjdk version "17.0.15" 2025-04-15'."""
    try:
        done = subprocess.run(["java", "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except OSError:
        return "Java ?"
    lines = (done.stderr or done.stdout).splitlines()
    return lines[0].strip() if lines else "Java ?"


def run_broker(bench: Bench) -> None:
    settings = bench.settings
    info = bench.scenarios.setdefault(SCENARIO, {"runs": {}})
    info.update({
        "partitions": PARTITIONS, "record_bytes": RECORD_BYTES,
        "segment_bytes": settings.broker_segment_bytes,
        "remote_bytes_wanted": settings.broker_remote_bytes,
        "chunk_bytes": CHUNK_BYTES, "small_chunk_bytes": SMALL_CHUNK_BYTES,
        "prefetch_bytes": PREFETCH_BYTES,
        "broker_heap": BROKER_HEAP, "sidecar_cache_size": settings.sidecar_cache_size,
        "kafka_version": _kafka_version(), "java_version": _java_version(),
        "variants": [label for _, label in VARIANTS],
    })
    print(f"{SCENARIO}: a real Kafka broker, {PARTITIONS} partitions, "
          f"{settings.broker_remote_bytes / MiB:.0f} MiB in remote storage, consumers "
          "catching up through each remote storage path", file=sys.stderr, flush=True)
    with ExitStack() as stack:
        try:
            setup = _prepare(bench, stack)
        except Exception as exc:  # the broker's, kafka-python's and botocore's alike
            bench.errors.append({"scenario": SCENARIO, "run": "setup",
                                 "error": f"{type(exc).__name__}: {exc}"[-4000:]})
            print(f"  {SCENARIO}/setup FAILED: {exc!r}", file=sys.stderr, flush=True)
            return
        try:
            for run, label in VARIANTS:
                bench.attempt(SCENARIO, run, partial(_row, bench, setup, run, label))
        finally:
            setup.cluster.keep_logs(bench.work / "logs" / "broker")
