"""The stand-in remote storage manager's disk chunk cache (the broker benchmark's
`plugin-cache` row) on a real broker.

One KRaft broker whose manager (tests/kafka/src) writes to moto behind the fault
proxy, which records what reaches the origin, with `rsm.config.chunk.cache.*`
set: 1 MiB chunks, 2 MiB of prefetch. A catch-up from offset 0 checks every
record; the origin sees each `.log` byte once, in closed-range GETs of a chunk
and the chunks after it; a second catch-up reads the log from the cache alone;
with a cache smaller than the log, the cache directory stays within its size.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka.admin import KafkaAdminClient, NewTopic

from bench.broker import log_metadata_readiness, restart_broker
from sidecar.layout import parse_aiven_key
from sidecar.tools.broker import TIERED_TOPIC, KafkaCluster, RemoteStorage
from sidecar.tools.catch_up import catch_up, produce
from tests.support.fault_proxy import FaultProxy
from tests.support.s3_clients import s3_client
from tests.support.waiting import eventually

pytestmark = pytest.mark.functional

MiB = 1024 * 1024
CHUNK = MiB
PREFETCH = 2 * MiB
BUCKET = "chunk-cache"
TOPIC = "cached"
RECORDS, RECORD = 12_000, 1000
KEY, SECRET = "tiered-storage-plugin", "plugin-secret-0123456789"


def _settings(storage: RemoteStorage, cache: Path, size: int) -> dict[str, str]:
    return {**storage.properties(), "rsm.config.chunk.cache.path": str(cache),
            "rsm.config.chunk.cache.size": str(size),
            "rsm.config.chunk.cache.prefetch.max.size": str(PREFETCH)}


@pytest.fixture(scope="module")
def cluster(fault_proxy: FaultProxy, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[tuple[KafkaCluster, RemoteStorage, Path]]:
    work = tmp_path_factory.mktemp("chunk-cache")
    s3_client(fault_proxy.endpoint).create_bucket(Bucket=BUCKET)
    storage = RemoteStorage(fault_proxy.endpoint, BUCKET, KEY, SECRET, chunk_size=CHUNK)
    with KafkaCluster(work / "kafka", storage,
                      extra=_settings(storage, work / "cache", 64 * MiB)) as started:
        log_metadata_readiness(started)
        admin = KafkaAdminClient(bootstrap_servers=started.bootstrap)
        try:
            admin.create_topics([NewTopic(TOPIC, 1, 1, topic_configs={
                **TIERED_TOPIC, "segment.bytes": str(4 * MiB)})])
        finally:
            admin.close()
        produce(started.bootstrap, TOPIC, [0], RECORDS, RECORD)
        eventually(lambda: _tiered(started, fault_proxy), "the closed segments tiered",
                   timeout=90)
        yield started, storage, work


def _tiered(cluster: KafkaCluster, origin: FaultProxy) -> bool:
    local = sorted((cluster.nodes[0].data / f"{TOPIC}-0").glob("*.log"))
    listing = s3_client(origin.endpoint).list_objects_v2(Bucket=BUCKET).get("Contents", [])
    remote = [key.start_offset for key in map(parse_aiven_key, [i["Key"] for i in listing])
              if key and key.suffix == "log"]
    return len(local) == 1 and int(local[0].stem) > 0 and bool(remote) and \
        max(remote) < int(local[0].stem)


def _log_gets(origin: FaultProxy) -> list[tuple[str, int, int]]:
    found = []
    for seen in origin.requests("GET"):
        if seen.key.startswith(f"{TOPIC}-") and seen.key.endswith(".log"):
            assert seen.range is not None, f"a whole-object GET of {seen.key}"
            first, _, last = seen.range.removeprefix("bytes=").partition("-")
            assert last, f"an open range: {seen.range}"
            found.append((seen.key, int(first), int(last)))
    return found


def test_misses_fetch_a_window_once_and_rereads_come_from_the_cache(
    cluster: tuple[KafkaCluster, RemoteStorage, Path], fault_proxy: FaultProxy
) -> None:
    broker, _, work = cluster
    fault_proxy.seen.clear()
    assert catch_up(broker.bootstrap, TOPIC, [0], RECORDS, RECORD).records == RECORDS

    gets = _log_gets(fault_proxy)
    assert gets
    spans: dict[str, list[tuple[int, int]]] = {}
    for key, first, last in gets:
        assert first % CHUNK == 0, f"a GET not on a chunk boundary: {first}"
        assert last - first + 1 <= CHUNK + PREFETCH
        spans.setdefault(key, []).append((first, last))
    assert any(last - first + 1 > CHUNK for _, first, last in gets), "no prefetch window"
    for key, ranges in spans.items():
        ranges.sort()
        assert all(a[1] < b[0] for a, b in itertools.pairwise(ranges)), (
            f"bytes of {key} fetched twice: {ranges}")
    files = list((work / "cache").iterdir())
    assert files and not [f for f in files if f.name.endswith(".partial")]

    fault_proxy.seen.clear()
    assert catch_up(broker.bootstrap, TOPIC, [0], RECORDS, RECORD).records == RECORDS
    assert _log_gets(fault_proxy) == []


def test_a_cache_smaller_than_the_log_stays_within_its_size(
    cluster: tuple[KafkaCluster, RemoteStorage, Path], fault_proxy: FaultProxy
) -> None:
    broker, storage, work = cluster
    small = work / "small-cache"
    restart_broker(broker, _settings(storage, small, 3 * MiB))
    fault_proxy.seen.clear()
    assert catch_up(broker.bootstrap, TOPIC, [0], RECORDS, RECORD).records == RECORDS
    assert _log_gets(fault_proxy)
    assert 0 < sum(path.stat().st_size for path in small.iterdir()) <= 3 * MiB
