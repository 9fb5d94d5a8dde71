"""What the job learns from the Kafka cluster, as plain data (read by `cluster`).

Kafka's own names where they exist: a broker's node id, host, port and rack
(Metadata / DescribeCluster), a partition's leader, replicas and in-sync
replicas (Metadata), a group's committed offset (OffsetFetch) and a partition's
log end offset, the offset the next record will get (ListOffsets, latest).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

NO_LEADER = -1  # Metadata's leader id of a partition that has none (offline)


@dataclass(frozen=True)
class Broker:
    node_id: int
    host: str
    port: int
    rack: str | None = None


@dataclass(frozen=True)
class PartitionReplicas:
    leader: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]


@dataclass(frozen=True)
class GroupPosition:
    """One partition of a consumer group's replay: where it will read next and the end."""

    committed: int | None  # None: the group committed nothing for this partition
    end: int  # the partition's log end offset
    # The first offset after the replay's `to_time` (ListOffsets by time), which
    # ends its reads there; None without a to_time or when no record is that late.
    stop: int | None = None
    # The first offset still on the leader's disk (ListOffsets EARLIEST_LOCAL,
    # KIP-405): reads from there on are served from the disk, never from remote
    # storage. None where the broker cannot say (before ListOffsets v8).
    local_start: int | None = None


@dataclass(frozen=True)
class Placement:
    """Where a broker's pod runs in Kubernetes (spark_warmup.placement): its node's
    name and address, and the pod IP of the sidecar on that node (None, with
    `problem` saying why, where the node has no ready sidecar)."""

    node: str
    node_ip: str
    sidecar_ip: str | None
    problem: str | None = None


@dataclass(frozen=True)
class ClusterFacts:
    bootstrap: str  # for messages: where the facts came from
    brokers: Mapping[int, Broker] = field(default_factory=dict)
    # (topic, partition) -> its replicas, for every partition of the plan's topics
    partitions: Mapping[tuple[str, int], PartitionReplicas] = field(default_factory=dict)
    # replay index -> {partition: position}, for the replays that name a group
    groups: Mapping[int, Mapping[int, GroupPosition]] = field(default_factory=dict)
    # broker id -> where its pod runs, for templates with placement fields
    placements: Mapping[int, Placement] = field(default_factory=dict)
    # topic -> its id as the bucket's keys spell it (Uuid.toString()), for the
    # plan's topics: a topic deleted and created again has another, and the old
    # one's remote segments may still be in the bucket
    topic_ids: Mapping[str, str] = field(default_factory=dict)
