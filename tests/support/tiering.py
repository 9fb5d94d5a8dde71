"""Awaiting tiering on a real broker: every closed segment of a partition in the
bucket (Aiven's key layout) and gone from the broker's log directory."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sidecar.layout import parse_aiven_key
from sidecar.tools.broker import KafkaCluster
from tests.support.waiting import eventually


def remote_logs(client: Any, bucket: str, topic: str, partition: int) -> dict[int, int]:
    """The bucket's .log objects of a partition: start offset -> size."""
    found = {}
    for item in client.list_objects_v2(Bucket=bucket).get("Contents", []):
        key = parse_aiven_key(item["Key"])
        if key and key.topic == topic and key.partition == partition and key.suffix == "log":
            found[key.start_offset] = item["Size"]
    return found


def await_tiered(cluster: KafkaCluster, client: Any, bucket: str, topic: str,
                 partitions: Iterable[int], timeout: float = 90) -> dict[int, list[int]]:
    """Until only the active segment of each partition is local and every segment
    before it is remote; each partition's remote segments' start offsets."""
    wanted = list(partitions)

    def tiered() -> dict[int, list[int]] | None:
        found = {}
        for partition in wanted:
            local = cluster.local_segments(topic, partition)
            remote = sorted(remote_logs(client, bucket, topic, partition))
            # The active segment alone stays local, and remote storage reaches it.
            if len(local) != 1 or local[0] == 0 or not remote or remote[-1] >= local[0]:
                return None
            found[partition] = remote
        return found

    return eventually(tiered, f"{topic}'s closed segments tiered and deleted locally",
                      timeout=timeout)
