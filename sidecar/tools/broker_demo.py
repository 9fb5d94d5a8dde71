"""`sidecar demo --broker`: a real Kafka broker reads its cold segments through the sidecar.

The local S3 server (moto), the sidecar in front of it with its secure default
(signed requests only; the broker's remote storage manager signs with a key
given to the sidecar in `SIDECAR_AUTH_KEYS`), and one Apache Kafka broker
(`sidecar.tools.broker`, the jars of `make kafka`) whose remote storage manager
points at the sidecar. It produces records of known content to a tiered topic,
waits until the closed segments are in the bucket and gone from the broker's
log directory, then catches two consumer groups up from offset 0, checking
every record: the first reads the segments through the sidecar from the
origin, the second from the sidecar's cache. It prints what each read and
how fast, with the sidecar's hit ratio over each, then serves until SIGINT or
SIGTERM. Everything runs on 127.0.0.1 on free ports; every process stops and
the run's directory is removed when it stops.
"""

from __future__ import annotations

import json
import logging
import secrets
import shutil
import signal
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory
from types import FrameType
from typing import Any

from kafka.errors import KafkaError

from sidecar.errors import ConfigError
from sidecar.tools.broker import (
    TIERED_TOPIC,
    BrokerError,
    KafkaCluster,
    RemoteStorage,
    Tiered,
    broker_lib,
)
from sidecar.tools.catch_up import CatchUp, CatchUpError, catch_up, produce
from sidecar.tools.commands import program
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3, loopback_client
from sidecar.tools.serve_process import ServeError, ServeProcess

BUCKET = "tiered"
TOPIC = "demo"
PARTITIONS = 3
#: Per partition about 8 MB: four or five segments of 2 MiB, all but the active one
#: tiered.
RECORDS = 8_000
RECORD_BYTES = 1000
SEGMENT_BYTES = 2 * 1024 * 1024
#: Room for every tiered object of the topic (a slot each, 8 MiB blocks) and more,
#: so that the second group finds all of it cached.
CACHE_SIZE = "512MiB"
#: The key the broker's remote storage manager signs with (the secret is the run's own).
BROKER_KEY = "kafka-broker"
TIER_TIMEOUT_S = 90.0
CATCH_UP_TIMEOUT_S = 120.0
PEEK_RECORDS = 2
BANNER_END = "Press Ctrl-C to stop."
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class DemoFailed(RuntimeError):
    """The demo could not do what it shows (a broker or sidecar that did not start,
    segments never tiered, a record read back wrong)."""


class _Stop(BaseException):
    """SIGINT or SIGTERM. A BaseException, as KeyboardInterrupt is, so that no
    library's `except Exception` swallows it on its way to the clean-up."""


def check_prerequisites() -> None:
    """The broker's jars and a Java runtime, before anything starts: ConfigError
    (exit 2, one line) when either is missing."""
    try:
        broker_lib()
    except BrokerError as exc:
        raise ConfigError(str(exc)) from None
    if shutil.which("java") is None:
        raise ConfigError("no `java` on PATH: the Kafka broker needs a Java 17+ runtime")


def run_broker_demo(listen: str, admin_listen: str, seconds: float | None) -> None:
    """The whole demo; returns once stopped by SIGINT/SIGTERM (or after `seconds`
    of serving), everything cleaned up. DemoFailed when it cannot show what it shows."""
    check_prerequisites()
    # kafka-python narrates connections at INFO, its producer's settings at WARNING and,
    # as ERROR, what it then retries (a topic not yet in its metadata): the terminal is
    # for the demo's lines. A failure still ends in one, from the exception.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    try:
        with _stoppable() as stack:
            _run(stack, listen, admin_listen, seconds)
    except (BrokerError, ServeError, CatchUpError, KafkaError) as exc:
        raise DemoFailed(str(exc) or type(exc).__name__) from None


def _run(stack: ExitStack, listen: str, admin_listen: str, seconds: float | None) -> None:
    run_dir = Path(stack.enter_context(TemporaryDirectory(prefix="sidecar-demo-broker-")))
    origin = stack.enter_context(LocalS3())
    s3 = _s3(origin.endpoint)
    stack.callback(s3.close)
    s3.create_bucket(Bucket=BUCKET)
    secret = secrets.token_urlsafe(18)
    cache = run_dir / "cache"
    cache.mkdir()
    # The broker's storage settings need the sidecar's address, known once it
    # serves; what the sidecar serves depends only on the bucket and the key.
    served = RemoteStorage("", BUCKET, BROKER_KEY, secret).sidecar_settings()
    sidecar = stack.enter_context(ServeProcess(
        {"--listen": listen, "--admin-listen": admin_listen,
         "--origin-endpoint": origin.endpoint, "--cache-dir": str(cache),
         "--cache-size": CACHE_SIZE},
        {**CREDENTIALS,
         # The secure default, spelled out: only signed requests, by the sidecar's
         # own origin key or the broker's, and only the broker's bucket.
         "SIDECAR_AUTH_ALLOW_ANONYMOUS": "false",
         "SIDECAR_AUTH_KEYS": f"{BROKER_KEY}:{secret}", **served},
        run_dir / "sidecar.log"))
    storage = RemoteStorage(sidecar.data_url, BUCKET, BROKER_KEY, secret)
    cluster = stack.enter_context(KafkaCluster(run_dir / "kafka", storage))
    bootstrap = cluster.bootstrap
    _say(_header(origin.endpoint, sidecar, bootstrap, run_dir))

    _create_topic(bootstrap)
    started = time.monotonic()
    written = produce(bootstrap, TOPIC, range(PARTITIONS), RECORDS, RECORD_BYTES)
    _say(f"Produced {PARTITIONS * RECORDS:,} records ({PARTITIONS} partitions x "
         f"{RECORDS:,}, {RECORD_BYTES:,}-byte values, {written / 1e6:.1f} MB) to topic "
         f"'{TOPIC}' in {time.monotonic() - started:.1f} s")
    started = time.monotonic()
    try:
        remote = cluster.await_tiered(s3, BUCKET, TOPIC, range(PARTITIONS), TIER_TIMEOUT_S)
    except BrokerError as exc:
        raise DemoFailed(str(exc)) from None
    _say(f"Tiered: {sum(len(part.remote) for part in remote.values())} closed segments of "
         f"{SEGMENT_BYTES // 2**20} MiB in bucket '{BUCKET}' and gone from the broker's "
         f"log dir ({_offsets(remote)}) in {time.monotonic() - started:.1f} s")

    first = _group(bootstrap, sidecar.admin_url, "demo-first")
    _say(_summary("demo-first", "through the sidecar from the origin", *first))
    _say("Its first records, read again from remote storage:")
    for line in _peek(bootstrap):
        _say("  " + line)
    _await_idle(sidecar.admin_url)
    second = _group(bootstrap, sidecar.admin_url, "demo-second")
    _say(_summary("demo-second", "now from the sidecar's cache", *second))
    _say(_banner(sidecar, bootstrap, secret, run_dir, remote))
    threading.Event().wait(timeout=seconds)


def _say(text: str) -> None:
    print(text, flush=True)


@contextmanager
def _stoppable() -> Iterator[ExitStack]:
    """SIGINT and SIGTERM stop the demo wherever it is (starting, producing, reading
    or serving), through every clean-up of the stack; once the clean-up has begun,
    no signal cuts it short (a broker left running would outlive the demo)."""
    def stop(signum: int, frame: FrameType | None) -> None:
        _hold_signals()
        raise _Stop(signum)

    previous = {each: signal.signal(each, stop) for each in STOP_SIGNALS}
    try:
        with ExitStack() as stack:
            try:
                yield stack
            finally:
                _hold_signals()
    except _Stop:
        pass
    finally:
        for each, handler in previous.items():
            signal.signal(each, handler)


def _hold_signals() -> None:
    for each in STOP_SIGNALS:
        signal.signal(each, signal.SIG_IGN)


def _s3(endpoint: str) -> Any:
    return loopback_client(endpoint, key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                           secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
                           region=CREDENTIALS["AWS_DEFAULT_REGION"])


def _create_topic(bootstrap: str) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1, topic_configs={
            **TIERED_TOPIC, "segment.bytes": str(SEGMENT_BYTES)})])
    finally:
        admin.close()


def _offsets(remote: dict[int, Tiered]) -> str:
    ends = {part.active_base for part in remote.values()}
    if len(ends) == 1:
        return f"offsets 0-{ends.pop() - 1:,} of each partition remote"
    return ", ".join(f"partition {partition}: offsets 0-{part.active_base - 1:,} remote"
                     for partition, part in sorted(remote.items()))


def _stats(admin_url: str) -> dict[str, Any]:
    with urllib.request.urlopen(admin_url + "/api/v1/stats", timeout=10) as response:
        stats: dict[str, Any] = json.load(response)
        return stats


@dataclass(frozen=True)
class Served:
    """What the sidecar served over one catch-up (the difference of its counters)."""

    from_cache: int
    from_origin: int
    origin_bytes: int

    @property
    def hit_ratio(self) -> float | None:
        served = self.from_cache + self.from_origin
        return self.from_cache / served if served else None


def _served(before: dict[str, Any], after: dict[str, Any]) -> Served:
    return Served(
        after["served_bytes"]["cache"] - before["served_bytes"]["cache"],
        after["served_bytes"]["origin"] - before["served_bytes"]["origin"],
        after["origin_bytes"] - before["origin_bytes"])


def _group(bootstrap: str, admin_url: str, group: str) -> tuple[CatchUp, Served]:
    before = _stats(admin_url)
    done = catch_up(bootstrap, TOPIC, list(range(PARTITIONS)), RECORDS, RECORD_BYTES,
                    group=group, timeout_s=CATCH_UP_TIMEOUT_S)
    return done, _served(before, _stats(admin_url))


def _summary(group: str, how: str, done: CatchUp, served: Served) -> str:
    ratio = "n/a" if served.hit_ratio is None else f"{served.hit_ratio:.3f}"
    return (f"Group {group} caught up from offset 0 ({how}): {done.records:,} records "
            f"checked, {done.value_bytes / 1e6:.1f} MB in {done.seconds:.1f} s = "
            f"{done.mb_per_s:.1f} MB/s, fetch p99 {done.fetch_p99():.3f} s; sidecar hit "
            f"ratio {ratio} (of {(served.from_cache + served.from_origin) / 2**20:.1f} MiB "
            f"served, {served.from_cache / 2**20:.1f} MiB from its cache; "
            f"{served.origin_bytes / 2**20:.1f} MiB read from the origin)")


def _peek(bootstrap: str) -> list[str]:
    """The first records of each partition, as lines: offset, key, the value's size
    and first bytes (the partition and index it was produced as, then seeded bytes)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             max_partition_fetch_bytes=64 * 1024)
    assigned = [TopicPartition(TOPIC, partition) for partition in range(PARTITIONS)]
    consumer.assign(assigned)
    consumer.seek_to_beginning(*assigned)
    found: dict[int, list[Any]] = {partition: [] for partition in range(PARTITIONS)}
    deadline = time.monotonic() + CATCH_UP_TIMEOUT_S
    try:
        while any(len(records) < PEEK_RECORDS for records in found.values()):
            if time.monotonic() > deadline:
                raise DemoFailed("the first records were not read back in "
                                 f"{CATCH_UP_TIMEOUT_S:g}s")
            for tp, records in consumer.poll(timeout_ms=1000).items():
                found[tp.partition].extend(records)
                if len(found[tp.partition]) >= PEEK_RECORDS:
                    consumer.pause(tp)
    finally:
        consumer.close()
    return [_record_line(record) for partition in sorted(found)
            for record in found[partition][:PEEK_RECORDS]]


def _record_line(record: Any) -> str:
    value: bytes = record.value
    partition, index = struct.unpack_from(">IQ", value)
    return (f"{record.topic}-{record.partition} offset {record.offset:,}  key "
            f"{record.key.decode()}  value {len(value):,} bytes: partition {partition}, "
            f"record {index}, then {value[12:20].hex()}...")


def _await_idle(admin_url: str) -> None:
    """Until the first group's read-ahead is all in: the second group's counters are
    then its own."""
    deadline = time.monotonic() + 30.0
    while not _stats(admin_url)["engine"]["idle"] and time.monotonic() < deadline:
        time.sleep(0.1)


def _header(origin_endpoint: str, sidecar: ServeProcess, bootstrap: str, run_dir: Path) -> str:
    return "\n".join([
        "",
        "Kafka tiered-storage read sidecar: demo with a real broker",
        f"  origin (local S3, moto):  {origin_endpoint}  bucket '{BUCKET}'",
        f"  sidecar S3 endpoint:      {sidecar.data_url}  (signed requests only; the "
        f"broker signs as '{BROKER_KEY}')",
        f"  sidecar admin:            {sidecar.admin_url}",
        f"  Kafka broker:             {bootstrap}  (Apache Kafka, KRaft, tiered storage "
        "read and written through the sidecar)",
        f"  demo files:               {run_dir}  (removed when the demo stops)",
        "",
    ])


def _banner(sidecar: ServeProcess, bootstrap: str, secret: str, run_dir: Path,
            remote: dict[int, Tiered]) -> str:
    """What to try while the demo serves; "Press Ctrl-C" is its last line."""
    signed = f"AWS_ACCESS_KEY_ID={BROKER_KEY} AWS_SECRET_ACCESS_KEY={secret} \\"
    consumer = (
        f"from kafka import KafkaConsumer; c = KafkaConsumer('{TOPIC}', "
        f"bootstrap_servers='{bootstrap}', group_id='mine', auto_offset_reset='earliest', "
        "consumer_timeout_ms=5000); print(sum(1 for _ in c), 'records')")
    return "\n".join([
        "",
        f"Kafka bootstrap: {bootstrap}  topic '{TOPIC}', {PARTITIONS} partitions, "
        f"{_offsets(remote)}",
        "Consume it from offset 0 with a group of your own (kafka-python, in this venv):",
        f"  {program('python')} -c \"{consumer}\"",
        "",
        f"The broker's segments in bucket '{BUCKET}', read through the sidecar as the broker "
        "reads them (signed with the broker's key):",
        f"  {signed}",
        f"  {program('sidecar')} replay --endpoint {sidecar.data_url} --bucket {BUCKET} "
        f"--topic {TOPIC} "
        f"--admin {sidecar.admin_url}",
        f"  {signed}",
        f"  aws s3 ls --recursive s3://{BUCKET}/ --endpoint-url {sidecar.data_url}",
        "An unsigned request gets 403 AccessDenied (the sidecar's secure default):",
        f"  curl -i {sidecar.data_url}/{BUCKET}/",
        "",
        "Hit rates, origin traffic and the cache:",
        f"  {program('sidecar')} stats --admin {sidecar.admin_url}",
        f"  curl {sidecar.admin_url}/metrics",
        f"  {sidecar.admin_url}/ui  (live, in a browser)",
        "",
        f"Demo files (cache, sidecar log, broker data and logs), removed when the demo stops: "
        f"{run_dir}",
        BANNER_END,
    ])
