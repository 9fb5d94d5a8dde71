"""Which node's sidecar warms a partition: the plan's assignment, else the broker that
will serve the partition (from the cluster's metadata), else rendezvous hashing.

A replay is read through the broker that serves the partition: its leader, or
with fetch-from-follower (KIP-392) a replica in the consumer's rack. Warming any
other node's sidecar fills a cache nobody reads, so with a cluster in the plan
every partition goes to the sidecar of its serving broker(s), found by the
plan's broker-id map or its URL template. Each broker becomes the node
`broker-ID` in the report.

Hashing remains only for plans with neither a cluster nor an assignment entry
for the partition. Rendezvous (highest-random-weight) hashing scores every node
for a partition and takes the highest: all planners agree without coordination,
and adding or removing a node moves only the partitions that go to or came from
that node. The score is SHA-256 of `node|topic-partition`, stable across
processes and Python versions (unlike `hash()`, which is salted per process).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from spark_warmup.metadata import NO_LEADER, Broker, ClusterFacts, PartitionReplicas, Placement
from spark_warmup.placement import url_fields
from spark_warmup.plan import KafkaSpec, Plan, PlanError
from spark_warmup.sidecar_urls import SidecarUrlError, check_sidecar_url


def partition_name(topic: str, partition: int) -> str:
    return f"{topic}-{partition}"


def broker_node(node_id: int) -> str:
    """The node name of a broker's sidecar, in reports and per-node rates."""
    return f"broker-{node_id}"


def rendezvous_score(node: str, item: str) -> int:
    digest = hashlib.sha256(f"{node}|{item}".encode()).digest()
    return int.from_bytes(digest[:8], "big")


def rendezvous_node(item: str, nodes: Iterable[str]) -> str:
    """The node with the highest score for `item` (ties, vanishingly rare, by name)."""
    candidates = list(nodes)
    if not candidates:
        raise ValueError("no nodes to route to")
    return max(candidates, key=lambda node: (rendezvous_score(node, item), node))


def route(topic: str, partition: int, nodes: Iterable[str], assignment: Mapping[str, str]) -> str:
    name = partition_name(topic, partition)
    assigned = assignment.get(name)
    return assigned if assigned is not None else rendezvous_node(name, nodes)


def serving_brokers(replicas: PartitionReplicas, replica: str, rack: str | None,
                    brokers: Mapping[int, Broker]) -> tuple[int, ...]:
    """The brokers that will serve reads of a partition, for the plan's `replica` choice.

    `rack`: as Kafka's RackAwareReplicaSelector picks for a consumer in `rack`, the
    leader if it is there, else a replica there, else the leader. Of several
    replicas in the rack it takes the most caught-up at the fetch (largest log
    end offset), which no metadata says ahead: every in-sync one there is
    warmed, in broker-id order.
    `all`: every replica the cluster knows a broker for (one may be down).
    """
    leader = () if replicas.leader == NO_LEADER else (replicas.leader,)
    if replica == "all":
        return tuple(node for node in replicas.replicas if node in brokers) or leader
    if replica == "rack" and leader and _rack(brokers, replicas.leader) != rack:
        in_rack = [node for node in replicas.isr if _rack(brokers, node) == rack]
        if in_rack:
            return tuple(sorted(in_rack))
    return leader


def sidecar_url(broker: Broker, spec: KafkaSpec,
                placement: Placement | None = None) -> str | None:
    """The admin URL of the sidecar on `broker`: the plan's map, else its template
    (None where the template needs a sidecar that the broker's node lacks)."""
    explicit = spec.broker_sidecars.get(broker.node_id)
    if explicit is not None:
        return explicit
    if spec.sidecar_url is None:
        return None
    fields = {}
    if spec.needs_placement:
        if placement is None or placement.sidecar_ip is None:
            return None
        fields = url_fields(placement)
    # An IPv6 literal goes in brackets in a URL (RFC 3986, section 3.2.2).
    host = f"[{broker.host}]" if ":" in broker.host else broker.host
    url = spec.sidecar_url.format(host=host, id=broker.node_id, rack=broker.rack or "",
                                  **fields)
    # The host, rack and placement come from the cluster's metadata and the API
    # server: checked before the admin token goes there (spark_warmup.sidecar_urls).
    try:
        return check_sidecar_url(url)
    except SidecarUrlError as exc:
        raise PlanError(f"kafka.sidecar_url: broker {broker.node_id} advertises host "
                        f"{broker.host!r}, which makes no sidecar URL: {exc}") from None


@dataclass(frozen=True)
class Routes:
    """Where each partition is warmed, and the URL of every node that warms."""

    nodes: Mapping[str, str]  # node -> sidecar admin URL
    targets: Mapping[tuple[str, int], tuple[str, ...]]  # (topic, partition) -> nodes
    hashed: tuple[str, ...] = ()  # "topic-partition" placed by hashing, for the warning
    # "topic-partition on broker ID": with replica "all", the replicas whose broker
    # the cluster does not list now (down), so not warmed: for the warning.
    unlisted_replicas: tuple[str, ...] = ()


def route_partitions(partitions: Iterable[tuple[str, int, str]], plan: Plan,
                     cluster: ClusterFacts | None) -> Routes:
    """Route every (topic, partition, replay field) to its node(s): assignment first,
    then the cluster's serving broker(s), then (no cluster) rendezvous hashing."""
    nodes = dict(plan.sidecars)
    targets: dict[tuple[str, int], tuple[str, ...]] = {}
    hashed: list[str] = []
    unlisted: list[str] = []
    for topic, partition, where in sorted(set(partitions)):
        name = partition_name(topic, partition)
        assigned = plan.assignment.get(name)
        if assigned is not None:
            targets[(topic, partition)] = (assigned,)
        elif cluster is not None and plan.kafka is not None:
            targets[(topic, partition)] = _from_cluster(
                topic, partition, where, plan.kafka, cluster, nodes)
            replicas = cluster.partitions.get((topic, partition))
            if plan.kafka.replica == "all" and replicas is not None:
                unlisted += [f"{name} on broker {node_id}" for node_id in replicas.replicas
                             if node_id not in cluster.brokers]
        else:
            targets[(topic, partition)] = (rendezvous_node(name, sorted(plan.sidecars)),)
            # With one sidecar there is no other node the bytes could have gone to.
            if len(plan.sidecars) > 1:
                hashed.append(name)
    return Routes(nodes, targets, tuple(hashed), tuple(unlisted))


def _from_cluster(topic: str, partition: int, where: str, spec: KafkaSpec,
                  cluster: ClusterFacts, nodes: dict[str, str]) -> tuple[str, ...]:
    name = partition_name(topic, partition)
    replicas = cluster.partitions.get((topic, partition))
    if replicas is None:
        raise PlanError(f"{where}.partitions: partition {partition} of {topic!r} has remote "
                        f"segments but is not in the cluster at {cluster.bootstrap}")
    chosen = serving_brokers(replicas, spec.replica, spec.rack, cluster.brokers)
    if not chosen or any(node_id not in cluster.brokers for node_id in chosen):
        raise PlanError(f"{where}: partition {name} has no leader the cluster at "
                        f"{cluster.bootstrap} knows (leader {replicas.leader}); it cannot "
                        "be read now")
    names = []
    for node_id in chosen:
        broker = cluster.brokers[node_id]
        placement = cluster.placements.get(node_id)
        url = sidecar_url(broker, spec, placement)
        if url is None:
            where_not = f" ({placement.problem})" if placement and placement.problem else ""
            raise PlanError(
                f"kafka.sidecars: broker {node_id} ({broker.host}:{broker.port}), which serves "
                f"{name}, has no sidecar{where_not}; add kafka.sidecars.\"{node_id}\" or a "
                "kafka.sidecar_url template")
        node = broker_node(node_id)
        if nodes.setdefault(node, url) != url:
            raise PlanError(f"sidecars.{node}: {nodes[node]} is not the sidecar the cluster "
                            f"gives broker {node_id} ({url})")
        names.append(node)
    return tuple(names)


def _rack(brokers: Mapping[int, Broker], node_id: int) -> str | None:
    broker = brokers.get(node_id)
    return broker.rack if broker is not None else None
