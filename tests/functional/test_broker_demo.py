"""`sidecar demo --broker` as a user runs it: a real Kafka broker, its tiered storage
through the sidecar (secure default), two consumer groups caught up and measured,
then serving until a signal, after which no process and no file of the run is left.
"""

from __future__ import annotations

import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from sidecar.tools.broker_demo import BANNER_END, PARTITIONS, RECORD_BYTES, RECORDS

pytestmark = pytest.mark.functional

#: The whole run up to its banner: broker start, produce, tiering, two catch-ups.
BANNER_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 30.0
SUMMARY = re.compile(
    r"^Group (?P<group>\S+) caught up from offset 0 \([^)]*\): (?P<records>[\d,]+) records "
    r"checked, (?P<mb>[\d.]+) MB in [\d.]+ s = (?P<rate>[\d.]+) MB/s, fetch p99 [\d.]+ s; "
    r"sidecar hit ratio (?P<ratio>[\d.]+) \(of (?P<served>[\d.]+) MiB served, [\d.]+ MiB "
    r"from its cache; (?P<origin>[\d.]+) MiB read from the origin\)$")


@dataclass
class Demo:
    """The demo as a child process, its stdout read line by line as it comes."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str | None] = field(default_factory=queue.Queue)
    output: list[str] = field(default_factory=list)

    def read_until(self, wanted: str, timeout: float) -> str:
        """Lines up to the one containing `wanted`; fails once `timeout` has passed or
        the demo has ended without it."""
        deadline = time.monotonic() + timeout
        while not any(wanted in line for line in self.output):
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {wanted!r} after {timeout:g}s:\n"
                                     f"{''.join(self.output)}") from None
            if line is None:
                code = self.process.wait()
                errors = self.process.stderr.read() if self.process.stderr else ""
                raise AssertionError(f"the demo ended ({code}) before {wanted!r}:\n"
                                     f"{''.join(self.output)}\nstderr:\n{errors}")
            self.output.append(line)
        return "".join(self.output)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.process.pid).children(recursive=True)


@contextmanager
def broker_demo() -> Iterator[Demo]:
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "demo", "--broker"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    demo = Demo(process)

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            demo.lines.put(line)
        demo.lines.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    try:
        yield demo
    finally:
        if process.poll() is None:
            # A failed assertion: the demo's own clean-up still ends its children.
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        reader.join(timeout=10)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()


def stopped_cleanly(demo: Demo, signum: int, children: list[psutil.Process],
                    run_dir: Path) -> str:
    """Send `signum`; the demo exits 0 leaving no process and no file of its run.
    Returns what it wrote on stderr."""
    demo.process.send_signal(signum)
    assert demo.process.wait(timeout=STOP_TIMEOUT_S) == 0
    assert demo.process.stderr is not None
    stderr = demo.process.stderr.read()
    left = [child for child in children if child.is_running()
            and child.status() != psutil.STATUS_ZOMBIE]
    assert not left, f"left running: {[child.cmdline()[:3] for child in left]}"
    assert not run_dir.exists()
    return stderr


def found(pattern: str, text: str) -> str:
    match = re.search(pattern, text, re.M)
    assert match, f"{pattern!r} not in:\n{text}"
    return match.group(1)


def test_two_groups_catch_up_through_the_sidecar_then_sigint_leaves_nothing() -> None:
    with broker_demo() as demo:
        printed = demo.read_until(BANNER_END, BANNER_TIMEOUT_S)
        children = demo.descendants()
        assert any("java" in Path(child.exe()).name for child in children), (
            "no broker process among the demo's children")
        run_dir = Path(found(r"removed when the demo stops: (\S+)$", printed))
        assert run_dir.is_dir() and run_dir.name.startswith("sidecar-demo-broker-")

        tiered = int(found(r"^Tiered: (\d+) closed segments", printed))
        assert tiered >= 2 * PARTITIONS, "not several segments per partition tiered"
        summaries = {match["group"]: match for match in (
            SUMMARY.match(line.rstrip("\n")) for line in demo.output) if match}
        assert list(summaries) == ["demo-first", "demo-second"], printed
        for summary in summaries.values():
            assert int(summary["records"].replace(",", "")) == PARTITIONS * RECORDS
            assert float(summary["mb"]) >= PARTITIONS * RECORDS * RECORD_BYTES / 1e6
            assert 0.5 < float(summary["rate"]) < 10_000, summary["rate"]
            # Every record was read from remote storage, through the sidecar.
            assert float(summary["served"]) * 2**20 >= PARTITIONS * RECORDS * RECORD_BYTES
        first, second = summaries["demo-first"], summaries["demo-second"]
        assert float(first["origin"]) > 0 and float(first["ratio"]) < 1.0
        assert float(second["ratio"]) >= 0.99 and float(second["origin"]) == 0.0
        assert re.search(r"^  demo-0 offset 0  key 0:0  value 1,000 bytes: partition 0, "
                         r"record 0, then [0-9a-f]+", printed, re.M), printed

        # The sidecar keeps its secure default: an unsigned read is refused.
        endpoint = found(r"^\s+sidecar S3 endpoint:\s+(\S+)", printed)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{endpoint}/tiered/", timeout=10)
        assert refused.value.code == 403

        stderr = stopped_cleanly(demo, signal.SIGINT, children, run_dir)
    assert "Traceback" not in stderr, stderr
    lines = [line.rstrip("\n") for line in demo.output if line.strip()]
    assert lines[-1] == BANNER_END and lines.count(BANNER_END) == 1


def test_sigterm_while_it_catches_up_stops_the_broker_and_the_rest() -> None:
    with broker_demo() as demo:
        # Once tiered: a broker stopped while it still copies segments waits for its
        # remote log metadata producer, up to the 20 s after which it is killed.
        printed = demo.read_until("Group demo-first ", BANNER_TIMEOUT_S)
        children = demo.descendants()
        assert any("java" in Path(child.exe()).name for child in children)
        run_dir = Path(found(r"^\s+demo files:\s+(\S+)", printed))
        stderr = stopped_cleanly(demo, signal.SIGTERM, children, run_dir)
    assert "Traceback" not in stderr, stderr
    assert BANNER_END not in "".join(demo.output)

