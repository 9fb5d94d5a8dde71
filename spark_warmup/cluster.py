"""Driver side: read the Kafka cluster's metadata and the groups' offsets (kafka-python).

Only the driver talks to Kafka, once, before anything is listed or warmed; the
executors never import this module (nor kafka-python). One admin client asks:

- DescribeCluster (Metadata on older brokers): every broker's id, host, port, rack;
- Metadata for the plan's topics: each partition's leader, replicas and ISR;
- for each replay naming a group: FindCoordinator and OffsetFetch (its committed
  offsets), and ListOffsets at the partitions' leaders (the log end offset, the
  first offset still on the leader's disk, and for `to_time` the first offset
  after that time).

What comes back is translated here into `metadata`'s plain dataclasses, and every
failure into a PlanError naming the plan field to look at.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from spark_warmup.metadata import Broker, ClusterFacts, GroupPosition, PartitionReplicas
from spark_warmup.placement import place_brokers
from spark_warmup.plan import KafkaSpec, Plan, PlanError, Replay

CLIENT_ID = "spark_warmup"
# Metadata's topic error codes (org.apache.kafka.common.protocol.Errors).
_UNKNOWN_TOPIC = 3
_TOPIC_AUTHORIZATION_FAILED = 29


def read_cluster(plan: Plan) -> ClusterFacts | None:
    """The facts the plan's routing and group replays need; None for a plan with no cluster."""
    spec = plan.kafka
    if spec is None:
        return None
    where = ",".join(spec.bootstrap_servers)
    with _admin(spec, where) as admin:
        brokers = _brokers(admin, where)
        partitions, topic_ids = _partitions(admin, plan.replays, where)
        groups = {
            index: _group_positions(admin, replay, partitions, where)
            for index, replay in enumerate(plan.replays) if replay.group is not None
        }
    placements = place_brokers(brokers, spec) if spec.needs_placement else {}
    return ClusterFacts(where, brokers, partitions, groups, placements, topic_ids)


@contextmanager
def _admin(spec: KafkaSpec, where: str) -> Iterator[Any]:
    from kafka.admin import KafkaAdminClient
    from kafka.errors import KafkaError

    timeout_ms = int(spec.timeout_s * 1000)
    try:
        admin = KafkaAdminClient(
            bootstrap_servers=list(spec.bootstrap_servers), client_id=CLIENT_ID,
            request_timeout_ms=timeout_ms, bootstrap_timeout_ms=timeout_ms,
            **dict(spec.security),
        )
    except KafkaError as exc:
        field = "kafka.security" if _is_auth(exc) else "kafka.bootstrap_servers"
        raise PlanError(f"{field}: cannot reach the cluster at {where} within "
                        f"{spec.timeout_s:g} s: {_describe(exc)}") from None
    except (OSError, ValueError) as exc:  # a certificate file that cannot be read, ...
        raise PlanError(f"kafka.security: the client cannot start: {_describe(exc)}") from None
    try:
        yield admin
    finally:
        admin.close()


def _brokers(admin: Any, where: str) -> dict[int, Broker]:
    from kafka.errors import KafkaError

    try:
        described = admin.describe_cluster()
    except KafkaError as exc:
        raise PlanError(f"kafka: the cluster at {where} did not describe its brokers: "
                        f"{_describe(exc)}") from None
    return {
        int(b["broker_id"]): Broker(int(b["broker_id"]), str(b["host"]), int(b["port"]),
                                    b.get("rack"))
        for b in described["brokers"]
    }


def _partitions(admin: Any, replays: Sequence[Replay], where: str
                ) -> tuple[dict[tuple[str, int], PartitionReplicas], dict[str, str]]:
    """Every partition of the plan's topics with its replicas, and each topic's id."""
    from kafka.errors import KafkaError

    first_use: dict[str, str] = {}
    for replay in replays:
        first_use.setdefault(replay.topic, replay.where)
    try:
        topics = admin.describe_topics(sorted(first_use))
    except KafkaError as exc:
        raise PlanError(f"kafka: the cluster at {where} did not describe the plan's topics: "
                        f"{_describe(exc)}") from None
    found: dict[tuple[str, int], PartitionReplicas] = {}
    topic_ids: dict[str, str] = {}
    for topic in topics:
        name = str(topic["name"])
        replay_where = first_use.get(name, "replays")
        if topic["error_code"] == _UNKNOWN_TOPIC:
            raise PlanError(f"{replay_where}.topic: no topic {name!r} in the cluster at {where}")
        if topic["error_code"] == _TOPIC_AUTHORIZATION_FAILED:
            raise PlanError(f"{replay_where}.topic: the cluster at {where} refuses to describe "
                            f"topic {name!r} to this client (not authorized)")
        if topic["error_code"]:
            raise PlanError(f"{replay_where}.topic: the cluster at {where} answered error "
                            f"{topic['error_code']} for topic {name!r}")
        topic_id = _topic_uuid(topic.get("topic_id"))
        if topic_id is not None:
            topic_ids[name] = uuid_string(topic_id)
        for partition in topic["partitions"]:
            found[(name, int(partition["partition_index"]))] = PartitionReplicas(
                leader=int(partition["leader_id"]),
                replicas=tuple(int(n) for n in partition["replica_nodes"]),
                isr=tuple(int(n) for n in partition["isr_nodes"]),
            )
    for replay in replays:
        present = sorted(p for t, p in found if t == replay.topic)
        missing = sorted(set(replay.partitions or ()) - set(present))
        if missing:
            raise PlanError(f"{replay.where}.partitions: topic {replay.topic!r} has no partition "
                            f"{missing[0]} in the cluster at {where} (it has {len(present)})")
    return found, topic_ids


def _topic_uuid(value: object) -> uuid.UUID | None:
    """A Metadata answer's topic id (kafka-python gives its str() form), or None
    for none: the zero id of a broker before 2.8, or what is no UUID."""
    try:
        topic_id = value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
    except ValueError:
        return None
    return topic_id if topic_id.int != 0 else None


def uuid_string(value: uuid.UUID) -> str:
    """A Kafka Uuid as Uuid.toString() writes it, and the bucket's keys with it:
    its 16 bytes in URL-safe base64, unpadded."""
    return base64.urlsafe_b64encode(value.bytes).decode("ascii").rstrip("=")


def _group_positions(admin: Any, replay: Replay,
                     partitions: Mapping[tuple[str, int], PartitionReplicas],
                     where: str) -> dict[int, GroupPosition]:
    from kafka.errors import KafkaError
    from kafka.protocol.consumer import OffsetSpec
    from kafka.structs import TopicPartition

    group = replay.group
    assert group is not None
    wanted = replay.partitions or tuple(sorted(p for t, p in partitions if t == replay.topic))
    asked = [TopicPartition(replay.topic, p) for p in wanted]
    try:
        committed = admin.list_group_offsets({group: asked}).get(group, {})
    except KafkaError as exc:
        raise PlanError(f"{replay.where}.group: the cluster at {where} did not give group "
                        f"{group!r}'s offsets: {_describe(exc)}") from None
    # Kafka answers offset -1 for a partition the group has not committed (and
    # for a group it does not know at all).
    offsets = {tp.partition: int(meta.offset) for tp, meta in committed.items()
               if tp.topic == replay.topic and meta.offset >= 0}
    if not offsets:
        raise PlanError(f"{replay.where}.group: group {group!r} has no committed offsets for "
                        f"topic {replay.topic!r} in the cluster at {where}")
    try:
        ends = admin.list_partition_offsets({tp: OffsetSpec.LATEST for tp in asked})
        if replay.times_ms is not None and replay.times_ms.last is not None:
            # The first offset after `to_time` ends the range (-1: none yet, the log end).
            after = admin.list_partition_offsets(
                {tp: replay.times_ms.last + 1 for tp in asked})
        else:
            after = {}
    except KafkaError as exc:
        raise PlanError(f"{replay.where}.topic: the cluster at {where} did not give the end "
                        f"offsets of topic {replay.topic!r}: {_describe(exc)}") from None
    local = _local_starts(admin, replay, asked, where)
    positions = {}
    for tp in asked:
        stop = int(after[tp].offset) if tp in after and after[tp].offset >= 0 else None
        positions[tp.partition] = GroupPosition(offsets.get(tp.partition),
                                                int(ends[tp].offset), stop, local.get(tp))
    return positions


def _local_starts(admin: Any, replay: Replay, asked: Sequence[Any], where: str
                  ) -> dict[Any, int]:
    """Each partition's first offset on its leader's disk (ListOffsets
    EARLIEST_LOCAL, KIP-405): the group's reads from there on never touch remote
    storage. Empty where the brokers predate it (ListOffsets v8): all the next
    reads are then taken as possibly remote, as before."""
    from kafka.errors import KafkaError, UnsupportedVersionError
    from kafka.protocol.consumer import OffsetSpec

    try:
        found = admin.list_partition_offsets({tp: OffsetSpec.EARLIEST_LOCAL for tp in asked})
    except UnsupportedVersionError:
        return {}
    except KafkaError as exc:
        raise PlanError(f"{replay.where}.topic: the cluster at {where} did not give the local "
                        f"log start offsets of topic {replay.topic!r}: {_describe(exc)}"
                        ) from None
    return {tp: int(answer.offset) for tp, answer in found.items() if answer.offset >= 0}


def _is_auth(exc: Exception) -> bool:
    from kafka.errors import (
        AuthorizationError,
        SaslAuthenticationFailedError,
        UnsupportedSaslMechanismError,
    )

    return isinstance(exc, AuthorizationError | SaslAuthenticationFailedError
                      | UnsupportedSaslMechanismError)


def _describe(exc: Exception) -> str:
    text = str(exc)
    name = type(exc).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name
