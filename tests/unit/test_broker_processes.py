"""A broker's process never outlives the process that started it (sidecar/tools/broker.py).

The broker is launched as KafkaCluster launches it, but its `java` is a shell
script that sleeps: what is checked is the process handling, not Kafka.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.waiting import eventually

#: Starts one "broker" as KafkaCluster does, prints its pid, then waits to be killed.
STARTER = """\
import sys
from pathlib import Path
from sidecar.tools.broker import BrokerNode, KafkaCluster
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
    broker = 0
    try:
        assert starter.stdout is not None
        broker = int(starter.stdout.readline())
        assert _running(broker)
        # SIGKILL, as the OOM killer ends a test run; SIGTERM, as a CI job's timeout
        # does (pytest has no handler for it: no `finally` runs).
        starter.send_signal(ending)
        assert starter.wait(timeout=10) == -ending
        eventually(lambda: not _running(broker), "the broker to end with its starter",
                   timeout=10)
    finally:
        starter.kill()
        starter.wait()
        for pipe in (starter.stdin, starter.stdout):
            if pipe is not None:
                pipe.close()
        if broker and _running(broker):
            os.killpg(broker, signal.SIGKILL)
