"""A real Apache Kafka broker reads its cold segments through the sidecar.

One KRaft broker (tests/kafka/pom.xml) with tiered storage on, its remote
storage manager pointed at a sidecar that runs its secure default (signatures
required, the manager signing with a key the sidecar accepts), in front of moto
behind the fault proxy, which records what reaches the origin and can take it
down. Each test has topics of its own: it produces records of known content,
waits until every closed segment is in the bucket and gone from the broker's
log directory, and consumes from offset 0, checking every record.
"""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic

from sidecar.layout import parse_aiven_key
from sidecar.tools import broker
from sidecar.tools.broker import (
    TIERED_TOPIC,
    KafkaCluster,
    RemoteStorage,
    free_port,
    remote_segments,
)
from sidecar.tools.catch_up import CatchUpError, catch_up, produce
from sidecar.tools.local_s3 import LocalS3
from tests.support.fault_proxy import FaultProxy
from tests.support.processes import SidecarProcess
from tests.support.s3_clients import s3_client
from tests.support.waiting import eventually

pytestmark = pytest.mark.functional

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
BLOCK = 8 * MiB
CHUNK = 4 * MiB
PLUGIN_KEY, PLUGIN_SECRET = "tiered-storage-plugin", "plugin-secret-0123456789"
RECORD = 1000
# 10 MiB segments: each closed one spans two 8 MiB blocks and three 4 MiB chunks.
SEGMENT_BYTES = 10 * MiB


@dataclass
class Rig:
    bucket: str
    origin: FaultProxy
    sidecar: SidecarProcess
    cluster: KafkaCluster
    access_log: Path
    cache_dir: Path
    listen: str
    env: dict[str, str]

    def restart_sidecar(self) -> None:
        self.sidecar = start_sidecar(self.origin, self.cache_dir, self.listen, self.env)

    def admin(self) -> Any:
        return KafkaAdminClient(bootstrap_servers=self.cluster.bootstrap)

    def access(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.access_log.read_text().splitlines()]


def start_sidecar(origin: FaultProxy, cache_dir: Path, listen: str,
                  env: dict[str, str]) -> SidecarProcess:
    return SidecarProcess(origin.endpoint, cache_dir, "--cache-size", str(48 * (BLOCK + 4096)),
                          listen=listen, env=env).__enter__()


@pytest.fixture(scope="module")
def rig(fault_proxy: FaultProxy, local_s3: LocalS3, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Rig]:
    work = tmp_path_factory.mktemp("broker")
    bucket = "tiered"
    client = s3_client(local_s3.endpoint)
    client.create_bucket(Bucket=bucket)
    cache_dir = work / "cache"
    cache_dir.mkdir()
    listen = f"127.0.0.1:{free_port()}"
    env = {
        # The secure default: only signed requests (the plugin's key or the sidecar's own).
        "SIDECAR_AUTH_ALLOW_ANONYMOUS": "false",
        "SIDECAR_AUTH_KEYS": f"{PLUGIN_KEY}:{PLUGIN_SECRET}",
        "SIDECAR_ACCESS_LOG": str(work / "access.log"),
        # Read-ahead one block at most, so that a catch-up still has blocks to fetch
        # when the outage test strikes.
        "SIDECAR_PREFETCH_MAX_WINDOW": "8MiB",
    }
    storage = RemoteStorage(f"http://{listen}", bucket, PLUGIN_KEY, PLUGIN_SECRET)
    # Only what the plugin needs: its bucket, its key scoped to it.
    env |= storage.sidecar_settings()
    rig = Rig(bucket, fault_proxy, start_sidecar(fault_proxy, cache_dir, listen, env),
              KafkaCluster(work / "kafka", storage), work / "access.log", cache_dir, listen, env)
    failed_before = request.session.testsfailed
    try:
        with rig.cluster:
            try:
                yield rig
            finally:
                if request.session.testsfailed > failed_before:
                    rig.cluster.keep_logs(ROOT / "test-artifacts" / "broker")
    finally:
        rig.sidecar.stop()


def tiered_topic(rig: Rig, name: str, partitions: int, per_partition: int) -> list[int]:
    """Create `name`, produce known records, and wait until every record is in the
    bucket and gone from the broker's log directory (the last segment too, rolled
    by local retention): a second reader then reads what the first read, from the
    same objects; the partitions."""
    admin = rig.admin()
    try:
        admin.create_topics([NewTopic(name, partitions, 1, topic_configs={
            **TIERED_TOPIC, "segment.bytes": str(SEGMENT_BYTES)})])
    finally:
        admin.close()
    ids = list(range(partitions))
    produce(rig.cluster.bootstrap, name, ids, per_partition, RECORD)
    rig.cluster.await_tiered(s3_client(rig.origin.endpoint), rig.bucket, name, ids,
                             end_offset=per_partition)
    return ids


def remote_logs(rig: Rig, topic: str, partition: int) -> dict[int, int]:
    """The bucket's .log objects of a partition: start offset -> size."""
    objects = remote_segments(s3_client(rig.origin.endpoint), rig.bucket, topic)
    return {start: suffixes["log"] for (number, start), suffixes in objects.items()
            if number == partition and "log" in suffixes}


def origin_log_gets(rig: Rig, topic: str) -> list[tuple[str, str | None]]:
    return [(seen.key, seen.range) for seen in rig.origin.requests("GET")
            if seen.key.startswith(f"{topic}-") and seen.key.endswith(".log")]


def test_catch_up_reads_every_record_through_the_sidecar(rig: Rig) -> None:
    partitions = tiered_topic(rig, "orders", 3, 22_000)
    rig.origin.seen.clear()
    done = catch_up(rig.cluster.bootstrap, "orders", partitions, 22_000, RECORD)
    assert done.records == 3 * 22_000

    # The plugin's pattern at the sidecar: manifests whole, indexes and .log chunks by
    # closed ranges, the chunks 4 MiB (the last of a segment shorter).
    reads = [line for line in rig.access() if line["method"] == "GET"
             and line["key"].startswith("orders-")]
    by_suffix: dict[str, list[dict[str, Any]]] = {}
    for line in reads:
        by_suffix.setdefault(line["key"].rpartition(".")[2], []).append(line)
    assert set(by_suffix) == {"rsm-manifest", "indexes", "log"}, set(by_suffix)
    assert all(line["range"] in (None, "") for line in by_suffix["rsm-manifest"])
    for line in by_suffix["indexes"] + by_suffix["log"]:
        first, _, last = line["range"].removeprefix("bytes=").partition("-")
        assert last, f"an open-ended range: {line}"
        assert line["status"] == 206
    chunk_reads = [line for line in by_suffix["log"] if line["first_byte"] % CHUNK == 0]
    assert chunk_reads == by_suffix["log"], "a .log read not on a chunk boundary"
    assert any(line["last_byte"] - line["first_byte"] + 1 == CHUNK for line in chunk_reads)

    # What reached the origin for .log data: whole 8 MiB-aligned blocks (a fetch is
    # read in up to four parts at once), never the same byte twice.
    gets = origin_log_gets(rig, "orders")
    assert gets
    remote = {partition: remote_logs(rig, "orders", partition) for partition in partitions}
    parts: dict[str, list[tuple[int, int]]] = {}
    for key, byte_range in gets:
        assert byte_range is not None, f"a whole-object GET of {key}"
        first, _, last = byte_range.removeprefix("bytes=").partition("-")
        parts.setdefault(key, []).append((int(first), int(last) + 1))
    for key, spans in parts.items():
        segment = parse_aiven_key(key)
        assert segment is not None
        size = remote[segment.partition][segment.start_offset]
        spans.sort()
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans)), (
            f"bytes of {key} fetched twice: {spans}")
        covered = {block for start, stop in spans for block in range(start // BLOCK,
                                                                   (stop - 1) // BLOCK + 1)}
        assert sum(stop - start for start, stop in spans) == sum(
            min(BLOCK, size - block * BLOCK) for block in covered), (
            f"{key}: not whole blocks: {spans}")


def test_a_second_group_reads_no_log_data_from_the_origin(rig: Rig) -> None:
    partitions = tiered_topic(rig, "replayed", 2, 12_000)
    first = catch_up(rig.cluster.bootstrap, "replayed", partitions, 12_000, RECORD,
                     group="first")
    assert first.records == 2 * 12_000
    rig.sidecar.wait_idle()
    assert origin_log_gets(rig, "replayed")
    rig.origin.seen.clear()
    logged = len(rig.access())
    plain = rig.sidecar.metric("sidecar_plain_range_requests_total")

    second = catch_up(rig.cluster.bootstrap, "replayed", partitions, 12_000, RECORD,
                      group="second")
    assert second.records == 2 * 12_000
    assert origin_log_gets(rig, "replayed") == []
    # The broker's ranged reads were answered before aiohttp
    # (s3/plain_ranges.py), but for an object's first read after its
    # remembered HEAD expired, which the handler answers (and closes its
    # connection after, so that the plugin's next read starts on a new one).
    ranged = [line for line in rig.access()[logged:] if line["method"] == "GET"
              and line["key"].startswith("replayed-") and line["status"] == 206]
    assert ranged
    answered_plain = rig.sidecar.metric("sidecar_plain_range_requests_total") - plain
    assert len(ranged) - len({line["key"] for line in ranged}) <= answered_plain <= len(ranged)


def test_uploads_and_deletes_pass_signed_and_unsigned_writes_are_refused(rig: Rig) -> None:
    tiered_topic(rig, "expiring", 1, 12_000)
    writes = [line for line in rig.access() if line["key"].startswith("expiring-")
              and line["method"] in ("PUT", "POST")]
    assert {line["key"].rpartition(".")[2] for line in writes} >= {
        "log", "indexes", "rsm-manifest"}
    assert all(line["status"] == 200 for line in writes), writes
    assert remote_logs(rig, "expiring", 0)

    unsigned = urllib.request.Request(
        f"{rig.sidecar.data_url}/{rig.bucket}/expiring-forged.log", data=b"x", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(unsigned, timeout=10)
    assert refused.value.code == 403

    # Retention: the broker deletes the remote segments, with DeleteObjects through the sidecar.
    admin = rig.admin()
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, "expiring",
                                            configs={"retention.ms": "1000"})])
    finally:
        admin.close()
    eventually(lambda: not remote_logs(rig, "expiring", 0),
               "the expired segments deleted from the bucket", timeout=60)
    deletes = [line for line in rig.access() if line["method"] == "POST"
               and line["status"] == 200 and line["key"] == ""]
    assert deletes, "no DeleteObjects reached the sidecar"
    assert any(seen.method == "POST" for seen in rig.origin.requests())


def test_a_topic_or_partition_the_cluster_lacks_is_named_at_once(rig: Rig) -> None:
    admin = rig.admin()
    try:
        admin.create_topics([NewTopic("single", 1, 1)])
    finally:
        admin.close()
    started = time.monotonic()
    with pytest.raises(CatchUpError, match=r"^topic 'absent' does not exist on 127\.0\.0\.1:"):
        catch_up(rig.cluster.bootstrap, "absent", [0], 10, timeout_s=60)
    with pytest.raises(CatchUpError, match=r"^topic 'single' has no partition 2, 3 \(it has 1\)$"):
        catch_up(rig.cluster.bootstrap, "single", [0, 2, 3], 10, timeout_s=60)
    # Producing too: kafka-python's producer would wait 60 s for the topic's metadata.
    with pytest.raises(CatchUpError, match=r"^topic 'absent' does not exist on 127\.0\.0\.1:"):
        produce(rig.cluster.bootstrap, "absent", [0], 10)
    # Each within the two seconds metadata is asked again for, not the catch-up's 60.
    assert time.monotonic() - started < 30


def test_a_sidecar_crash_and_an_origin_outage_lose_no_record(rig: Rig) -> None:
    partitions = tiered_topic(rig, "outage", 2, 32_000)
    started = threading.Event()
    refused = threading.Event()  # the consumer was told of the outage
    healed = threading.Event()
    downed_reads: list[int] = []

    def outage() -> None:
        # Early in the catch-up: the sidecar is killed, the origin goes down, the
        # sidecar comes back on its port and cache while the origin is still down,
        # and the origin heals once the outage has reached the consumer. Not
        # sooner: the first read to find the origin down may be read-ahead that
        # no consumer waits for, and the broker's S3 client retries its own.
        started.wait(timeout=240)
        rig.sidecar.kill()
        rig.origin.down = "503"
        rig.restart_sidecar()
        try:
            downed_reads.append(len(eventually(
                lambda: [seen for seen in rig.origin.seen if seen.fault == "down:503"],
                "a read to reach the downed origin", timeout=60)))
            refused.wait(timeout=120)
        finally:
            rig.origin.clear()
            healed.set()

    def in_the_middle(done: int) -> None:
        if done >= 2_000:
            started.set()

    rig.origin.seen.clear()
    striker = threading.Thread(target=outage, daemon=True)
    striker.start()
    try:
        done = catch_up(rig.cluster.bootstrap, "outage", partitions, 32_000, RECORD,
                        on_record=in_the_middle, on_error=lambda _: refused.set(),
                        timeout_s=240)
    finally:
        started.set()
        refused.set()  # the catch-up is over: the origin heals now, told or not
        striker.join(timeout=90)
    assert healed.is_set() and downed_reads
    assert done.records == 2 * 32_000
    assert done.fetch_errors > 0, "the outage never reached the consumer"
    assert rig.sidecar.alive()


def test_a_port_taken_before_the_broker_binds_it_is_a_fresh_start_not_a_failure(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The ports are picked free and bound seconds later by the JVM; here the first
    # one picked is taken meanwhile.
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    picked: list[int] = []

    def pick() -> int:
        picked.append(taken.getsockname()[1] if not picked else free_port())
        return picked[-1]

    monkeypatch.setattr(broker, "free_port", pick)
    try:
        with KafkaCluster(tmp_path / "kafka", None) as cluster:
            # Two ports a start (the controller's, the broker's): the first start
            # failed on the taken one, the second took others.
            assert len(picked) == 4
            assert taken.getsockname()[1] not in {node.port for node in cluster.nodes}
            admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
            try:
                assert len(admin.describe_cluster()["brokers"]) == 1
            finally:
                admin.close()
    finally:
        taken.close()
