"""`sidecar demo --broker` without a broker: the settings the README shows are the
ones it runs with, what a cluster takes as tiered, and the hit ratio it prints."""

from __future__ import annotations

import re
from pathlib import Path

from sidecar.tools.broker import (
    BrokerNode,
    KafkaCluster,
    RemoteStorage,
    Tiered,
    broker_properties,
)
from sidecar.tools.broker_demo import (
    BROKER_KEY,
    BUCKET,
    PARTITIONS,
    TOPIC,
    _offsets,
    _served,
)

ROOT = Path(__file__).resolve().parents[2]
SIDECAR_PORT = "<sidecar port>"
SECRET = "<the run's secret, also in SIDECAR_AUTH_KEYS>"


def readme_settings() -> dict[str, str]:
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## Demo with a real broker"):]
    block = re.search(r"```properties\n(.*?)```", section, re.S)
    assert block, "no properties block in the README's broker demo section"
    return dict(line.split("=", 1) for line in block.group(1).splitlines())


def test_the_readme_shows_the_broker_settings_the_demo_runs_with() -> None:
    storage = RemoteStorage(f"http://127.0.0.1:{SIDECAR_PORT}", BUCKET, BROKER_KEY, SECRET)
    props = broker_properties(1, 9092, 9093, Path("/data"), storage, controller=True)
    tiered = {key: value for key, value in props.items()
              if key.startswith(("remote.log.", "rsm.config.", "rlmm.config."))}
    assert readme_settings() == tiered


class Listing:
    """The bucket's listing as boto3's paginator gives it."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = keys

    def get_paginator(self, name: str) -> Listing:
        assert name == "list_objects_v2"
        return self

    def paginate(self, Bucket: str) -> list[dict[str, object]]:
        assert Bucket == BUCKET
        return [{"Contents": [{"Key": key, "Size": 1} for key in self.keys]}]


def segment_keys(partition: int, starts: list[int]) -> list[str]:
    return [f"{TOPIC}-{'A' * 22}/{partition}/{start:020d}-{'B' * 22}.{suffix}"
            for start in starts for suffix in ("log", "indexes", "rsm-manifest")]


def cluster_on(root: Path, active: dict[int, list[int]]) -> KafkaCluster:
    """A cluster of one node whose log directory holds these segments (none running)."""
    cluster = KafkaCluster(root, None, nodes=[BrokerNode(1, 0, root)])
    for partition, bases in active.items():
        folder = root / "data" / f"{TOPIC}-{partition}"
        folder.mkdir(parents=True)
        for base in bases:
            (folder / f"{base:020d}.log").touch()
    return cluster


def tiered(root: Path, active: dict[int, list[int]], keys: list[str]) -> dict[int, Tiered] | None:
    return cluster_on(root, active).tiered(Listing(keys), BUCKET, TOPIC, range(PARTITIONS))


def test_tiered_once_every_partition_has_only_its_active_segment_left(tmp_path: Path) -> None:
    keys = [key for partition in range(PARTITIONS)
            for key in segment_keys(partition, [0, 1800, 3600])]
    assert tiered(tmp_path, {partition: [5400] for partition in range(PARTITIONS)}, keys) == {
        partition: Tiered((0, 1800, 3600), 5400) for partition in range(PARTITIONS)}


def test_not_tiered_while_a_closed_segment_is_still_local_or_none_is_remote(
        tmp_path: Path) -> None:
    # (Kafka deletes a closed segment locally only once its copy is in remote storage.)
    keys = [key for partition in range(PARTITIONS)
            for key in segment_keys(partition, [0, 1800])]
    assert tiered(tmp_path / "a", {0: [1800, 3600], 1: [3600], 2: [3600]}, keys) is None
    assert tiered(tmp_path / "b", {0: [3600], 1: [3600], 2: [0]},
                  [key for key in keys if "/2/" not in key]) is None
    assert tiered(tmp_path / "c", {0: [3600], 1: [3600], 2: [3600]}, keys) is not None


def test_with_an_end_offset_not_tiered_until_the_active_segment_starts_there(
        tmp_path: Path) -> None:
    # Records 3600.. are still in the active segment: until local retention rolls it
    # and it is tiered, a first reader takes them from disk, a second from the bucket.
    keys = [key for partition in range(PARTITIONS)
            for key in segment_keys(partition, [0, 1800])]
    active = {partition: [3600] for partition in range(PARTITIONS)}
    cluster = cluster_on(tmp_path, active)
    assert cluster.tiered(Listing(keys), BUCKET, TOPIC, range(PARTITIONS), 5000) is None
    assert cluster.tiered(Listing(keys), BUCKET, TOPIC, range(PARTITIONS), 3600) == {
        partition: Tiered((0, 1800), 3600) for partition in range(PARTITIONS)}


def test_not_tiered_until_each_remote_segment_has_its_manifest_and_indexes(
        tmp_path: Path) -> None:
    keys = [key for partition in range(PARTITIONS)
            for key in segment_keys(partition, [0, 1800])]
    # The manifest is uploaded last: a segment without it is still on its way.
    last_manifest = next(key for key in reversed(keys) if key.endswith(".rsm-manifest"))
    assert tiered(tmp_path / "a", {0: [3600], 1: [3600], 2: [3600]},
                  [key for key in keys if key != last_manifest]) is None


def test_the_ranges_printed_name_each_partition_only_when_they_differ() -> None:
    four, three = (0, 2000, 4000, 6000), (0, 2000, 4000)
    assert _offsets({0: Tiered(four, 8000), 1: Tiered(four, 8000)}) == (
        "offsets 0-7,999 of each partition remote")
    assert _offsets({1: Tiered(four, 8000), 0: Tiered(three, 6000)}) == (
        "partition 0: offsets 0-5,999 remote, partition 1: offsets 0-7,999 remote")


def test_the_hit_ratio_is_that_of_the_bytes_served_over_one_catch_up() -> None:
    before = {"served_bytes": {"cache": 100, "origin": 300}, "origin_bytes": 400}
    after = {"served_bytes": {"cache": 400, "origin": 400}, "origin_bytes": 600}
    served = _served(before, after)
    assert (served.from_cache, served.from_origin, served.origin_bytes) == (300, 100, 200)
    assert served.hit_ratio == 0.75
    assert _served(after, after).hit_ratio is None
