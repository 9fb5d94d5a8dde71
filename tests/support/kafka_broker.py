"""A STAND-IN: a small Kafka-protocol server that answers for a fixture cluster.

A real broker now runs in the tests (sidecar/tools/broker.py: the real-broker
tests and the warm-up of a real lagging group). This stand-in is kept for the
warm-up job's cluster cases a small real cluster here cannot show cheaply:
replicas on two racks with rack-aware replica choice, exact offsets and lag over
segments built by the segment builder rather than by a broker, and brokers that
are named but cannot be reached. One listener per broker of a fixture cluster,
on 127.0.0.1 port 0, speaking the real wire protocol through kafka-python's own
request and response classes (`kafka.protocol.*`). It answers what the admin client asks
while reading metadata and group offsets, from the fixture:

- ApiVersions (only the APIs below, so the client asks nothing else),
- Metadata (brokers with their real ports and racks, partitions with leader,
  replicas and ISR; UNKNOWN_TOPIC_OR_PARTITION for a topic not in the fixture),
- DescribeCluster (the same brokers),
- FindCoordinator (the first broker coordinates every group),
- OffsetFetch (a group's committed offsets; none for an unknown group, as Kafka
  answers),
- ListOffsets (latest = the partition's end offset, earliest = its start,
  earliest local = the first offset on the leader's disk, and for a timestamp
  the first offset at or after it, the fixture's records being one per
  millisecond from `first_timestamp_ms`).

Every request it decoded is recorded as (broker id, API name) for assertions.
"""

from __future__ import annotations

import socket
import socketserver
import struct
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kafka.protocol.admin import DescribeClusterRequest, DescribeClusterResponse
from kafka.protocol.consumer import (
    ListOffsetsRequest,
    ListOffsetsResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest,
    ApiVersionsResponse,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataResponse,
)

# Kafka error codes (org.apache.kafka.common.protocol.Errors).
NONE = 0
UNKNOWN_TOPIC_OR_PARTITION = 3
# ListOffsets timestamps that ask for the log end, the log start offset and the
# first offset on the leader's disk (KIP-405).
LATEST = -1
EARLIEST = -2
EARLIEST_LOCAL = -4
# The frame size we accept from a client: these requests are a few KiB.
MAX_FRAME = 1 << 20

_REQUESTS: Mapping[int, Any] = {
    cls.API_KEY: cls for cls in (
        ApiVersionsRequest, MetadataRequest, DescribeClusterRequest, FindCoordinatorRequest,
        OffsetFetchRequest, ListOffsetsRequest,
    )
}


@dataclass(frozen=True)
class FixtureBroker:
    node_id: int
    rack: str | None = None


@dataclass(frozen=True)
class FixturePartition:
    leader: int
    replicas: tuple[int, ...]
    end_offset: int
    isr: tuple[int, ...] | None = None  # None: every replica in sync
    start_offset: int = 0
    first_timestamp_ms: int = 0  # record at offset o has timestamp first + o
    # The first offset on the leader's disk, the ones before it only in remote
    # storage; None: the whole log is on the disk.
    local_start_offset: int | None = None

    def offset_for_time(self, timestamp_ms: int) -> int:
        """ListOffsets by time: the first offset whose timestamp is >= it, -1 if none."""
        offset = max(self.start_offset, timestamp_ms - self.first_timestamp_ms)
        return offset if offset < self.end_offset else -1


@dataclass(frozen=True)
class FixtureCluster:
    brokers: tuple[FixtureBroker, ...]
    topics: Mapping[str, tuple[FixturePartition, ...]]
    # group -> {(topic, partition): committed offset}
    groups: Mapping[str, Mapping[tuple[str, int], int]] = field(default_factory=dict)
    # topic -> its id (Metadata); a random one for a topic not named here
    topic_ids: Mapping[str, uuid.UUID] = field(default_factory=dict)
    # The highest ListOffsets version offered: 7 is a broker before KIP-405's
    # earliest local offset (v8); None: kafka-python's own highest.
    list_offsets_version: int | None = None


class FakeKafkaCluster:
    """The listeners of a running fixture cluster; `bootstrap_servers` for clients."""

    def __init__(self, fixture: FixtureCluster) -> None:
        self.fixture = fixture
        self.ports: dict[int, int] = {}
        self.seen: list[tuple[int, str]] = []
        self._lock = threading.Lock()
        self._servers: list[socketserver.ThreadingTCPServer] = []
        self._threads: list[threading.Thread] = []
        self._topic_ids = {topic: fixture.topic_ids.get(topic) or uuid.uuid4()
                           for topic in fixture.topics}

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports.values())

    def start(self) -> FakeKafkaCluster:
        for broker in self.fixture.brokers:
            server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(self, broker),
                                                     bind_and_activate=True)
            server.daemon_threads = True
            self._servers.append(server)
            self.ports[broker.node_id] = server.server_address[1]
        for server in self._servers:
            thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                      daemon=True)
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()
        for thread in self._threads:
            thread.join(timeout=10)

    def apis_seen(self, node_id: int | None = None) -> list[str]:
        with self._lock:
            return [name for broker, name in self.seen if node_id is None or broker == node_id]

    # -- answers ----------------------------------------------------------

    def answer(self, broker: FixtureBroker, request: Any) -> Any:
        with self._lock:
            self.seen.append((broker.node_id, type(request).__name__.split("_")[0]))
        if isinstance(request, ApiVersionsRequest):
            limit = self.fixture.list_offsets_version
            return ApiVersionsResponse(error_code=NONE, api_keys=[
                ApiVersionsResponse.ApiVersion(
                    api_key=key, min_version=0,
                    max_version=limit if cls is ListOffsetsRequest and limit is not None
                    else cls.max_version)
                for key, cls in sorted(_REQUESTS.items())
            ], throttle_time_ms=0)
        if isinstance(request, MetadataRequest):
            return self._metadata(request)
        if isinstance(request, DescribeClusterRequest):
            return DescribeClusterResponse(
                throttle_time_ms=0, error_code=NONE, error_message=None, endpoint_type=1,
                cluster_id="fixture-cluster", controller_id=self.fixture.brokers[0].node_id,
                brokers=[DescribeClusterResponse.DescribeClusterBroker(
                    broker_id=b.node_id, host="127.0.0.1", port=self.ports[b.node_id],
                    rack=b.rack, is_fenced=False) for b in self.fixture.brokers],
                authorized_operations=set(),
            )
        if isinstance(request, FindCoordinatorRequest):
            return self._coordinator(request)
        if isinstance(request, OffsetFetchRequest):
            return self._offset_fetch(request)
        if isinstance(request, ListOffsetsRequest):
            return self._list_offsets(request)
        raise AssertionError(f"no answer for {type(request).__name__}")

    def _metadata(self, request: Any) -> Any:
        names = (list(self.fixture.topics) if request.topics is None
                 else [t.name for t in request.topics])
        topics = []
        for name in names:
            partitions = self.fixture.topics.get(name)
            if partitions is None:
                topics.append(MetadataResponse.MetadataResponseTopic(
                    error_code=UNKNOWN_TOPIC_OR_PARTITION, name=name,
                    topic_id=uuid.UUID(int=0), is_internal=False, partitions=[],
                    authorized_operations=set()))
                continue
            topics.append(MetadataResponse.MetadataResponseTopic(
                error_code=NONE, name=name, topic_id=self._topic_ids[name], is_internal=False,
                partitions=[
                    MetadataResponse.MetadataResponseTopic.MetadataResponsePartition(
                        error_code=NONE, partition_index=index, leader_id=p.leader,
                        leader_epoch=0, replica_nodes=list(p.replicas),
                        isr_nodes=list(p.replicas if p.isr is None else p.isr),
                        offline_replicas=[])
                    for index, p in enumerate(partitions)
                ],
                authorized_operations=set()))
        return MetadataResponse(
            throttle_time_ms=0,
            brokers=[MetadataResponse.MetadataResponseBroker(
                node_id=b.node_id, host="127.0.0.1", port=self.ports[b.node_id], rack=b.rack)
                for b in self.fixture.brokers],
            cluster_id="fixture-cluster", controller_id=self.fixture.brokers[0].node_id,
            topics=topics, authorized_operations=set(), error_code=NONE,
        )

    def _coordinator(self, request: Any) -> Any:
        first = self.fixture.brokers[0].node_id
        keys = list(request.coordinator_keys or []) or [request.key]
        return FindCoordinatorResponse(
            throttle_time_ms=0, error_code=NONE, error_message=None, node_id=first,
            host="127.0.0.1", port=self.ports[first],
            coordinators=[FindCoordinatorResponse.Coordinator(
                key=key, node_id=first, host="127.0.0.1", port=self.ports[first],
                error_code=NONE, error_message=None) for key in keys],
        )

    def _committed(self, group: str, wanted: Sequence[Any] | None) -> list[tuple[str, list[Any]]]:
        """(topic, [(partition, offset)]) of `group`: all it committed, or those asked for
        (-1 where it committed nothing, as Kafka answers)."""
        offsets = self.fixture.groups.get(group, {})
        if wanted is None:
            by_topic: dict[str, list[Any]] = {}
            for (topic, partition), offset in sorted(offsets.items()):
                by_topic.setdefault(topic, []).append((partition, offset))
            return list(by_topic.items())
        return [(t.name, [(p, offsets.get((t.name, p), -1)) for p in t.partition_indexes])
                for t in wanted]

    def _offset_fetch(self, request: Any) -> Any:
        if request.API_VERSION >= 8:
            group_class = OffsetFetchResponse.OffsetFetchResponseGroup
            topic_class = group_class.OffsetFetchResponseTopics
            partition_class = topic_class.OffsetFetchResponsePartitions
            return OffsetFetchResponse(throttle_time_ms=0, groups=[
                group_class(group_id=group.group_id, error_code=NONE, topics=[
                    topic_class(name=topic, topic_id=uuid.UUID(int=0), partitions=[
                        partition_class(partition_index=p, committed_offset=o,
                                        committed_leader_epoch=-1, metadata="", error_code=NONE)
                        for p, o in parts])
                    for topic, parts in self._committed(group.group_id, group.topics)])
                for group in request.groups])
        topic_class = OffsetFetchResponse.OffsetFetchResponseTopic
        partition_class = topic_class.OffsetFetchResponsePartition
        return OffsetFetchResponse(throttle_time_ms=0, error_code=NONE, topics=[
            topic_class(name=topic, partitions=[
                partition_class(partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                                metadata="", error_code=NONE) for p, o in parts])
            for topic, parts in self._committed(request.group_id, request.topics)])

    def _list_offsets(self, request: Any) -> Any:
        topic_class = ListOffsetsResponse.ListOffsetsTopicResponse
        partition_class = topic_class.ListOffsetsPartitionResponse
        topics = []
        for topic in request.topics:
            known = self.fixture.topics.get(topic.name, ())
            answers = []
            for asked in topic.partitions:
                if asked.partition_index >= len(known):
                    answers.append(partition_class(
                        partition_index=asked.partition_index,
                        error_code=UNKNOWN_TOPIC_OR_PARTITION, old_style_offsets=[],
                        timestamp=-1, offset=-1, leader_epoch=-1))
                    continue
                fixture = known[asked.partition_index]
                if asked.timestamp == EARLIEST:
                    offset = fixture.start_offset
                elif asked.timestamp == LATEST:
                    offset = fixture.end_offset
                elif asked.timestamp == EARLIEST_LOCAL:
                    offset = fixture.start_offset if fixture.local_start_offset is None \
                        else fixture.local_start_offset
                else:
                    offset = fixture.offset_for_time(asked.timestamp)
                answers.append(partition_class(
                    partition_index=asked.partition_index, error_code=NONE,
                    old_style_offsets=[offset], timestamp=-1, offset=offset, leader_epoch=0))
            topics.append(topic_class(name=topic.name, partitions=answers))
        return ListOffsetsResponse(throttle_time_ms=0, topics=topics)


def _handler(cluster: FakeKafkaCluster,
             broker: FixtureBroker) -> type[socketserver.BaseRequestHandler]:
    class Handler(socketserver.BaseRequestHandler):
        def handle(self) -> None:
            connection: socket.socket = self.request
            while True:  # one frame per request, until the client hangs up
                size_bytes = _read_exactly(connection, 4)
                if size_bytes is None:
                    return
                (size,) = struct.unpack(">i", size_bytes)
                if not 0 < size <= MAX_FRAME:
                    return
                frame = _read_exactly(connection, size)
                if frame is None:
                    return
                api_key, version = struct.unpack_from(">hh", frame)
                request_class = _REQUESTS.get(api_key)
                if request_class is None:
                    return  # the client asks only for what ApiVersions offered
                request = request_class.decode(frame, version=version, header=True)
                response = cluster.answer(broker, request)
                response.API_VERSION = version  # before the header: the setter would touch it
                response.with_header(correlation_id=request.header.correlation_id)
                connection.sendall(response.encode(header=True, framed=True))

    return Handler


def _read_exactly(connection: socket.socket, count: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < count:
        chunk = connection.recv(count - len(chunks))
        if not chunk:
            return None
        chunks += chunk
    return bytes(chunks)


@contextmanager
def running_cluster(fixture: FixtureCluster) -> Iterator[FakeKafkaCluster]:
    cluster = FakeKafkaCluster(fixture).start()
    try:
        yield cluster
    finally:
        cluster.stop()
