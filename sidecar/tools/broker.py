"""Real Apache Kafka brokers with tiered storage on, as child processes on loopback.

The broker demo, the real-broker tests and the `broker` benchmark start brokers
through this module. Each cluster is KRaft: node 1 is broker and controller in
one process, any further nodes are brokers that use node 1 as their controller.
Every listener is on 127.0.0.1 and a free port. Tiered storage is on, with the
topic-based remote log metadata manager (replication factor 1) and a remote
storage manager that writes Aiven's object layout to an S3 endpoint (the sidecar,
or the origin itself), tiering every second.

The broker's jars come from `tests/kafka/pom.xml` (`make kafka`, which `make test`
runs): Apache Kafka, its log4j2 binding and the remote storage manager built there.
Each broker runs in a process group of its own and its output goes to
`broker-N.log` in its directory; `stop` ends the group, always. A guard process
beside each broker ends its group too when the process that started it ends
without stopping it (SIGKILL, the OOM killer, a SIGTERM nothing handles).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from sidecar.layout import parse_aiven_key
from sidecar.tools.kafka_segments import kafka_uuid as segment_uuid
from sidecar.tools.ports import free_port

REPO = Path(__file__).resolve().parents[2]
#: Where `make kafka` puts the broker's jars (see tests/kafka/pom.xml).
DEFAULT_LIB = REPO / "tests" / "kafka" / "target" / "lib"
#: The remote storage manager the broker loads (tests/kafka/src): Aiven's object
#: layout and request pattern over AWS SDK v2 (see its docstring for why it is not
#: Aiven's own jar).
RSM_CLASS = "io.kcs.standin.StandInRemoteStorageManager"
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
#: Starts tried when a broker finds a port it was given taken.
START_ATTEMPTS = 3
#: Segments of 1 MiB (Kafka's smallest `segment.bytes`) tier within seconds.
SEGMENT_BYTES = 1024 * 1024

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
# Readiness is read from the line "Kafka Server started".
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""


#: The guard beside each broker (`python -c`, argv: the broker's process group, the
#: seconds SIGTERM is given before SIGKILL). Its stdin is a pipe that only the
#: starting process holds, so end of file there means that process is gone, however
#: it ended: the broker, a session of its own (a terminal's Ctrl-C reaches it only
#: through `stop`), would otherwise run on with its heap and ports until rebooted.
_GUARD = """\
import os, signal, sys, time
group, grace = int(sys.argv[1]), float(sys.argv[2])
sys.stdin.buffer.read()
try:
    os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        os.killpg(group, 0)
        time.sleep(0.1)
    os.killpg(group, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


class BrokerError(RuntimeError):
    """A broker that could not be started (missing jars, a failed format, no readiness)."""



def kafka_uuid() -> str:
    """A random Kafka Uuid as its toString() gives it (URL-safe base64, no padding),
    never one starting with ``-``: the storage tool would read it as an option."""
    return segment_uuid(random.SystemRandom())


def broker_lib(lib: Path | None = None) -> Path:
    """The folder of the broker's jars; BrokerError naming how to fetch them if absent."""
    folder = lib or Path(os.environ.get("SIDECAR_KAFKA_LIB", DEFAULT_LIB))
    kafkas = sorted(jar.name for jar in folder.glob("kafka_2.13-*.jar"))
    if not kafkas or not any(folder.glob("kafka-peer-*.jar")):
        raise BrokerError(
            f"no Kafka broker jars in {folder}: run `make kafka` (Maven fetches them "
            "from Maven Central per tests/kafka/pom.xml)")
    if len(kafkas) > 1:
        # Both on one classpath (`lib/*`): which class loads is the listing's chance.
        raise BrokerError(
            f"several Kafka versions in {folder} ({', '.join(kafkas)}): run `make kafka` "
            "again, which copies the jars of tests/kafka/pom.xml afresh")
    return folder


def kafka_version(lib: Path | None = None) -> str:
    """The Apache Kafka version of the broker's jars (from `kafka_2.13-VERSION.jar`)."""
    jar = next(broker_lib(lib).glob("kafka_2.13-*.jar"))
    return jar.name.removeprefix("kafka_2.13-").removesuffix(".jar")


@dataclass(frozen=True)
class RemoteStorage:
    """Where the brokers' remote storage manager reads and writes (its rsm.config.*)."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str
    region: str = "us-east-1"
    chunk_size: int = 4 * 1024 * 1024
    key_prefix: str = ""

    def properties(self) -> dict[str, str]:
        """The broker settings that select and configure the remote storage manager."""
        return {
            "remote.log.storage.manager.class.name": RSM_CLASS,
            "rsm.config.storage.s3.endpoint.url": self.endpoint,
            "rsm.config.storage.s3.bucket.name": self.bucket,
            "rsm.config.storage.s3.region": self.region,
            "rsm.config.storage.s3.path.style.access.enabled": "true",
            "rsm.config.storage.aws.access.key.id": self.access_key,
            "rsm.config.storage.aws.secret.access.key": self.secret_key,
            "rsm.config.chunk.size": str(self.chunk_size),
            "rsm.config.key.prefix": self.key_prefix,
        }

    def sidecar_settings(self) -> dict[str, str]:
        """What a sidecar in front of this storage serves, as env vars: the
        plugin's bucket alone, and the plugin's key scoped to it. The plugin
        needs nothing else: PutObject and multipart uploads, GetObject,
        HeadObject, DeleteObjects and ListObjectsV2 on that bucket (no bucket
        administration, no copies)."""
        return {
            "SIDECAR_ACCESS_BUCKETS": self.bucket,
            "SIDECAR_AUTH_SCOPES": f"{self.access_key}=read-write:{self.bucket}",
        }


#: Topic settings that send closed segments to remote storage and off the broker's
#: disk within seconds (local retention one second, deletion without delay).
TIERED_TOPIC = {
    "remote.storage.enable": "true",
    "segment.bytes": str(SEGMENT_BYTES),
    "local.retention.ms": "1000",
    "retention.ms": "-1",
    "file.delete.delay.ms": "0",
}


def broker_properties(node_id: int, port: int, controller_port: int, data: Path,
                      storage: RemoteStorage | None, controller: bool) -> dict[str, str]:
    """One node's server.properties: KRaft, loopback only, tiered storage on."""
    listeners = f"PLAINTEXT://127.0.0.1:{port}"
    if controller:
        listeners += f",CONTROLLER://127.0.0.1:{controller_port}"
    props = {
        "process.roles": "broker,controller" if controller else "broker",
        "node.id": str(node_id),
        "controller.quorum.voters": f"1@127.0.0.1:{controller_port}",
        "controller.listener.names": "CONTROLLER",
        "listeners": listeners,
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": "PLAINTEXT",
        "log.dirs": str(data),
        "num.partitions": "1",
        "auto.create.topics.enable": "false",
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        # Retention and tiering are checked every second, from the start.
        "log.initial.task.delay.ms": "0",
        "log.retention.check.interval.ms": "1000",
        "remote.log.manager.task.interval.ms": "1000",
        "remote.log.storage.system.enable": "true" if storage else "false",
        "remote.log.metadata.manager.listener.name": "PLAINTEXT",
        "rlmm.config.remote.log.metadata.topic.replication.factor": "1",
        "rlmm.config.remote.log.metadata.topic.num.partitions": "3",
    }
    if storage is not None:
        props.update(storage.properties())
    return props


@dataclass(frozen=True)
class Tiered:
    """A partition whose closed segments are all in the bucket and off the broker's disk."""

    remote: tuple[int, ...]  # the start offsets of its remote segments, in order
    active_base: int  # the base offset of its active segment: the first offset still local


def remote_segments(client: Any, bucket: str, topic: str) -> dict[tuple[int, int], dict[str, int]]:
    """The bucket's segment objects of `topic` (Aiven's layout, listed with a boto3
    client): (partition, start offset) -> {suffix: size}."""
    found: dict[tuple[int, int], dict[str, int]] = {}
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for item in page.get("Contents", ()):
            key = parse_aiven_key(item["Key"])
            if key is not None and key.topic == topic:
                found.setdefault((key.partition, key.start_offset), {})[key.suffix] = \
                    int(item["Size"])
    return found


@dataclass
class BrokerNode:
    node_id: int
    port: int
    directory: Path
    process: subprocess.Popen[bytes] | None = None
    #: Ends the broker's process group should this process end without `stop` (_GUARD).
    guard: subprocess.Popen[bytes] | None = None
    #: Where the log stood at this process's launch: a restart appends to the
    #: previous start's log, whose "Kafka Server started" is not this start's.
    log_start: int = 0

    @property
    def log_path(self) -> Path:
        return self.directory / f"broker-{self.node_id}.log"

    @property
    def data(self) -> Path:
        return self.directory / "data"

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log_text(self, since: int = 0) -> str:
        """The log from byte `since` on."""
        try:
            with self.log_path.open("rb") as log:
                log.seek(since)
                return log.read().decode(errors="replace")
        except OSError:
            return ""


@dataclass
class KafkaCluster:
    """`with KafkaCluster(workdir, storage, brokers=N) as cluster:` N brokers ready;
    `bootstrap` is their `host:port` list. Stopped (process groups) on exit."""

    workdir: Path
    storage: RemoteStorage | None
    brokers: int = 1
    heap: str = "512m"
    log_level: str = "WARN"
    extra: Mapping[str, str] = field(default_factory=dict)
    #: Settings of one node only (node id -> settings), e.g. its own sidecar's endpoint.
    extra_by_node: Mapping[int, Mapping[str, str]] = field(default_factory=dict)
    lib: Path | None = None
    #: Where every broker's log is copied when the `with` block ends in an exception.
    artifacts: Path | None = None
    nodes: list[BrokerNode] = field(default_factory=list)

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)

    def __enter__(self) -> KafkaCluster:
        lib = broker_lib(self.lib)
        java = shutil.which("java")
        if java is None:
            raise BrokerError("no `java` on PATH: the Kafka broker needs a Java 17+ runtime")
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "log4j2.properties").write_text(_LOG4J2.format(level=self.log_level))
        attempt = 1
        while True:
            try:
                self._start(java, lib)
                return self
            except BrokerError as exc:
                self.stop()
                if attempt == START_ATTEMPTS or "Address already in use" not in str(exc):
                    raise
                # Ports are picked free and bound seconds later by the JVM: another
                # process (or one of the broker's own outgoing connections) may take
                # one meanwhile. Start afresh on other ports.
                for node in self.nodes:
                    shutil.rmtree(node.directory, ignore_errors=True)
                self.nodes.clear()
                attempt += 1
            except BaseException:
                self.stop()
                raise

    def _start(self, java: str, lib: Path) -> None:
        cluster_id = kafka_uuid()
        controller_port = free_port()
        for node_id in range(1, self.brokers + 1):
            node = BrokerNode(node_id, free_port(), self.workdir / f"node-{node_id}")
            node.directory.mkdir(parents=True, exist_ok=True)
            props = broker_properties(node_id, node.port, controller_port, node.data,
                                      self.storage, controller=node_id == 1)
            props.update(self.extra)
            props.update(self.extra_by_node.get(node_id, {}))
            config = node.directory / "server.properties"
            config.write_text("".join(f"{key}={value}\n" for key, value in props.items()))
            self.nodes.append(node)
            self._format(java, lib, cluster_id, config, node)
        for node in self.nodes:
            self._launch(java, lib, node)
        for node in self.nodes:
            self._await_ready(node)
        if len(self.nodes) > 1:
            self._await_members()

    def _await_members(self) -> None:
        """Each broker is up, but learns of the others from the controller's
        metadata log a moment later: a client that meanwhile bootstraps from one
        of them may be sent to a broker it was not told of (kafka-python's
        UnknownBrokerIdError). Ready is every broker listing every broker."""
        from kafka import KafkaAdminClient  # the tools extra's; single brokers need none

        wanted = {node.node_id for node in self.nodes}
        deadline = time.monotonic() + START_TIMEOUT_S
        for node in self.nodes:
            known: set[int] = set()
            while time.monotonic() < deadline:
                admin = None
                try:
                    admin = KafkaAdminClient(bootstrap_servers=f"127.0.0.1:{node.port}",
                                             request_timeout_ms=5000)
                    # Fenced ones (registered, not yet serving) are in no
                    # client's metadata.
                    known = {int(broker["broker_id"])
                             for broker in admin.describe_cluster()["brokers"]
                             if not broker.get("is_fenced")}
                except Exception:  # not up to a client yet: asked again
                    known = set()
                finally:
                    if admin is not None:
                        admin.close()
                if known >= wanted:
                    break
                time.sleep(0.2)
            else:
                raise BrokerError(f"broker {node.node_id} knew brokers {sorted(known)} of "
                                  f"{sorted(wanted)} after {START_TIMEOUT_S:g}s")

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
        if exc is not None and self.artifacts is not None:
            self.keep_logs(self.artifacts)

    def _java(self, java: str, lib: Path, main: str, *args: str) -> list[str]:
        # The JVM flags of Kafka's own start scripts (kafka-server-start.sh's heap,
        # kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS), the heap at `heap`: the
        # garbage collector is a large part of what remote reads cost a broker.
        return [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-server", "-XX:+UseG1GC",
                "-XX:MaxGCPauseMillis=20", "-XX:InitiatingHeapOccupancyPercent=35",
                "-XX:+ExplicitGCInvokesConcurrent", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                "-cp", f"{lib}/*", main, *args]

    def _format(self, java: str, lib: Path, cluster_id: str, config: Path,
                node: BrokerNode) -> None:
        try:
            done = subprocess.run(
                self._java(java, lib, "kafka.tools.StorageTool", "format", "-t", cluster_id,
                           "-c", str(config), "--ignore-formatted"),
                capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            # A BrokerError as every failed start is (the demo reports those in a line).
            raise BrokerError(f"formatting node {node.node_id}'s storage did not end "
                              f"within {START_TIMEOUT_S:g}s") from None
        if done.returncode != 0:
            raise BrokerError(f"formatting node {node.node_id}'s storage failed "
                              f"({done.returncode}): {(done.stderr or done.stdout).strip()}")

    def _launch(self, java: str, lib: Path, node: BrokerNode) -> None:
        with node.log_path.open("ab") as log:
            node.log_start = log.tell()
            node.process = subprocess.Popen(
                self._java(java, lib, "kafka.Kafka", str(node.directory / "server.properties")),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        # A session of its own too, so that a Ctrl-C does not end the guard alone.
        node.guard = subprocess.Popen(
            [sys.executable, "-c", _GUARD, str(node.process.pid), f"{STOP_TIMEOUT_S:g}"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True)

    def _await_ready(self, node: BrokerNode) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert node.process is not None
            if node.process.poll() is not None:
                raise BrokerError(f"broker {node.node_id} exited with "
                                  f"{node.process.returncode}: {_tail(node.log_text())}")
            if "Kafka Server started" in node.log_text(node.log_start) and _accepts(node.port):
                return
            time.sleep(0.1)
        raise BrokerError(f"broker {node.node_id} not ready on 127.0.0.1:{node.port} after "
                          f"{START_TIMEOUT_S:g}s: {_tail(node.log_text())}")

    def local_segments(self, topic: str, partition: int) -> list[int]:
        """Base offsets of the segments of a partition in its brokers' log directories."""
        return sorted(int(log.stem) for node in self.nodes
                      for log in (node.data / f"{topic}-{partition}").glob("*.log"))

    def tiered(self, client: Any, bucket: str, topic: str, partitions: Iterable[int],
               end_offset: int | None = None) -> dict[int, Tiered] | None:
        """Each partition's state once only its active segment is local and every
        segment before it is in the bucket with its three objects; else None.

        `end_offset`: also wait until the active segment starts there, every
        record before it in the bucket. Kafka rolls an active segment whose
        records are all past local retention when remote storage is on
        (KAFKA-15047), so with TIERED_TOPIC's one second this follows within
        seconds of the last record; until then a reader takes the newest
        records from the broker's disk and, once the segment is rolled and
        tiered, the next reader from the bucket."""
        objects = remote_segments(client, bucket, topic)
        found = {}
        for partition in partitions:
            local = self.local_segments(topic, partition)
            remote = sorted(start for (number, start) in objects if number == partition)
            if (len(local) != 1 or local[0] == 0 or not remote or remote[-1] >= local[0]
                    or any(len(objects[(partition, start)]) != 3 for start in remote)
                    or (end_offset is not None and local[0] != end_offset)):
                return None
            found[partition] = Tiered(tuple(remote), local[0])
        return found

    def await_tiered(self, client: Any, bucket: str, topic: str, partitions: Iterable[int],
                     timeout_s: float = 90.0, end_offset: int | None = None
                     ) -> dict[int, Tiered]:
        """`tiered`, awaited (the broker tiers every second); BrokerError after `timeout_s`."""
        wanted = list(partitions)
        deadline = time.monotonic() + timeout_s
        while (state := self.tiered(client, bucket, topic, wanted, end_offset)) is None:
            if time.monotonic() > deadline:
                raise BrokerError(f"the closed segments of {topic!r} were not all tiered "
                                  f"within {timeout_s:g}s")
            time.sleep(0.2)
        return state

    def restart(self, node: BrokerNode) -> None:
        """Stop one broker's process group and start it again on the same port and data."""
        _stop(node)
        java = shutil.which("java")
        assert java is not None
        self._launch(java, broker_lib(self.lib), node)
        self._await_ready(node)

    def stop(self) -> None:
        for node in reversed(self.nodes):
            _stop(node)

    def keep_logs(self, destination: Path) -> list[Path]:
        """Copy every broker's log to `destination` (a failed test's artifacts)."""
        destination.mkdir(parents=True, exist_ok=True)
        kept = []
        for node in self.nodes:
            if node.log_path.exists():
                kept.append(Path(shutil.copy(node.log_path, destination / node.log_path.name)))
        return kept


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.splitlines()[-lines:]) or "(no output)"


def _stop(node: BrokerNode) -> None:
    # The guard first (the broker is stopped here), whether or not the broker
    # still runs: once the broker is gone its group's number may be reused.
    guard, node.guard = node.guard, None
    if guard is not None:
        guard.kill()
        guard.wait()
        assert guard.stdin is not None
        guard.stdin.close()
    process = node.process
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass
