"""A broker's process never outlives the process that started it, and a restarted
broker is awaited until it is ready again (sidecar/tools/broker.py).

The broker is launched as KafkaCluster launches it, but its `java` is a script
(that sleeps, or that listens and logs as Kafka does): what is checked is the
process handling, not Kafka.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.tools import broker
from sidecar.tools.broker import BrokerError, BrokerNode, KafkaCluster
from sidecar.tools.ports import free_port
from tests.support.waiting import eventually

#: Starts one "broker" as KafkaCluster does, prints its pid, then waits to be killed.
STARTER = """\
import sys
from pathlib import Path
from sidecar.tools import broker
from sidecar.tools.broker import BrokerError, BrokerNode, KafkaCluster
work, java = Path(sys.argv[1]), sys.argv[2]
node = BrokerNode(1, 0, work)
KafkaCluster(work, None)._launch(java, work, node)
print(node.pid, flush=True)
sys.stdin.read()
"""


def _running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.parametrize("ending", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_a_broker_ends_when_its_starter_ends_without_stopping_it(
        tmp_path: Path, ending: signal.Signals) -> None:
    java = tmp_path / "java"
    java.write_text("#!/bin/sh\nexec sleep 60\n")
    java.chmod(0o755)
    starter = subprocess.Popen([sys.executable, "-c", STARTER, str(tmp_path), str(java)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    broker_pid = 0
    try:
        assert starter.stdout is not None
        broker_pid = int(starter.stdout.readline())
        assert _running(broker_pid)
        # SIGKILL, as the OOM killer ends a test run; SIGTERM, as a CI job's timeout
        # does (pytest has no handler for it: no `finally` runs).
        starter.send_signal(ending)
        assert starter.wait(timeout=10) == -ending
        eventually(lambda: not _running(broker_pid), "the broker to end with its starter",
                   timeout=10)
    finally:
        starter.kill()
        starter.wait()
        for pipe in (starter.stdin, starter.stdout):
            if pipe is not None:
                pipe.close()
        if broker_pid and _running(broker_pid):
            os.killpg(broker_pid, signal.SIGKILL)


#: A "broker" that binds its port at once and says it started a moment later, as
#: Kafka's socket server binds before the broker is ready (its last argument is
#: its server.properties).
SLOW_BROKER = """\
import socket, sys, time
props = dict(line.split("=", 1) for line in open(sys.argv[-1]).read().splitlines())
listener = socket.create_server(("127.0.0.1", int(props["listeners"].rpartition(":")[2])))
time.sleep(1.0)
print("INFO [KafkaRaftServer nodeId=1] Kafka Server started", flush=True)
time.sleep(60)
"""


def _fake_java(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, script: str) -> Path:
    """`java` on PATH running the Python `script`, and a folder of (empty) broker jars."""
    lib = tmp_path / "lib"
    lib.mkdir()
    for jar in ("kafka_2.13-4.0.0.jar", "kafka-peer-1.jar"):
        (lib / jar).touch()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(f"#!{sys.executable}\n{script}")
    java.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return lib


def test_a_restart_awaits_this_start_not_the_line_the_previous_start_logged(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lib = _fake_java(tmp_path, monkeypatch, SLOW_BROKER)
    node = BrokerNode(1, free_port(), tmp_path / "node-1")
    node.directory.mkdir()
    (node.directory / "server.properties").write_text(
        f"listeners=PLAINTEXT://127.0.0.1:{node.port}\n")
    node.log_path.write_text("INFO [KafkaRaftServer nodeId=1] Kafka Server started\n")
    cluster = KafkaCluster(tmp_path, None, lib=lib, nodes=[node])
    try:
        cluster.restart(node)
        assert node.log_text().count("Kafka Server started") == 2, node.log_text()
    finally:
        cluster.stop()


def test_a_storage_format_that_hangs_is_a_broker_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The tools report a BrokerError in one line; any other exception is a traceback.
    lib = _fake_java(tmp_path, monkeypatch, "import time\ntime.sleep(60)\n")
    monkeypatch.setattr(broker, "START_TIMEOUT_S", 0.5)
    cluster = KafkaCluster(tmp_path / "kafka", None, lib=lib)
    with pytest.raises(BrokerError, match=r"^formatting node 1's storage did not end within "
                                          r"0\.5s$"), cluster:
        pass
