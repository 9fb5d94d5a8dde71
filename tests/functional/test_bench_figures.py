"""What the benchmark records: what bench/cpu.py reads of a server (real
process trees, /proc read as around a replay), and a failure as a failure."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench import cpu, light_client, run
from bench.dataset import QUICK, Dataset
from bench.harness import QUICK_SETTINGS, Bench
from bench.report import render_markdown
from tests.support.waiting import eventually

# A parent that starts a child, waits for it to end (so the kernel adds the
# child's figures to the parent's), says so in a file, then only sleeps.
_PARENT = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c", sys.argv[1]], check=True)
open(sys.argv[2], "w").close()
time.sleep(60)
"""
# A child that spins until it has used 0.5 s of CPU itself.
_SPINNER = """
import time
while time.process_time() < 0.5:
    sum(range(10_000))
"""
# A parent that starts a child and only waits; the child holds 96 MiB of
# touched memory, says so in a file, then sleeps.
_HOLDING_PARENT = """
import subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]])
"""
_HOLDER = """
import sys, time
held = bytearray(96 * 1024 * 1024)
for at in range(0, len(held), 4096):
    held[at] = 1
open(sys.argv[1], "w").close()
time.sleep(60)
"""
MiB = 1024 * 1024


@contextmanager
def _tree(parent: str, child: str, marker: Path) -> Iterator[int]:
    """`parent` running with `child`'s code, until `marker` exists: its pid."""
    process = subprocess.Popen([sys.executable, "-c", parent, child, str(marker)],
                               start_new_session=True)
    try:
        eventually(lambda: marker.exists() or None, "the process tree's marker", timeout=60)
        yield process.pid
    finally:
        os.killpg(process.pid, 9)
        process.wait(timeout=10)


def test_the_cpu_of_a_child_that_ended_meanwhile_is_counted(tmp_path: Path) -> None:
    """A child that ends during the window (nginx's cache loader does, a minute
    after the start) took CPU of the server's: it is not lost when it is
    waited for, and the server's figure never goes back."""
    marker = tmp_path / "child-ended"
    with _tree(_PARENT, _SPINNER, marker) as pid:
        used = cpu.usage(pid)
    assert used.user_s + used.system_s >= 0.5


def test_the_peak_rss_of_a_server_counts_its_children(tmp_path: Path) -> None:
    """nginx's master holds a few MiB; its workers hold the rest."""
    marker = tmp_path / "memory-held"
    with _tree(_HOLDING_PARENT, _HOLDER, marker) as pid:
        peak = cpu.peak_rss_bytes(pid)
    assert peak is not None and peak >= 96 * MiB


def _bench(tmp_path: Path) -> Bench:
    return Bench(QUICK_SETTINGS, Dataset(tmp_path / "data", QUICK, "", ()), tmp_path / "work")


def test_a_run_that_fails_in_any_way_is_recorded_and_the_next_runs(tmp_path: Path) -> None:
    """A client's report without a figure the scenario reads fails that run
    (shown failed, its error in the results), not the benchmark."""
    bench = _bench(tmp_path)
    bench.attempt("cost-4p", "sidecar_cold_1", lambda: {"bytes": 1}["mb_per_s"])
    bench.attempt("cost-4p", "sidecar_warm_1", lambda: {"mb_per_s": 512.0})
    assert bench.scenarios["cost-4p"]["runs"] == {"sidecar_cold_1": None,
                                                  "sidecar_warm_1": {"mb_per_s": 512.0}}
    assert bench.errors == [{"scenario": "cost-4p", "run": "sidecar_cold_1",
                             "error": "KeyError: 'mb_per_s'"}]


def test_a_step_that_fails_outside_its_runs_is_reported_failed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A scenario that breaks between its runs is listed under the report's
    failures, and the scenarios after it still run."""
    def broken(bench: Bench, selected: set[str]) -> None:
        bench.scenarios["wide-48p"] = {"rounds": 1, "runs": {}}
        raise TypeError("unsupported format string passed to NoneType.__format__")

    def fine(bench: Bench, selected: set[str]) -> None:
        bench.attempt("warmup", "spark", lambda: {"via": "spark"})

    monkeypatch.setattr(run, "STEPS", (run.Scenario(("cost-4p", "wide-48p"), broken),
                                       run.Scenario(("isolation",), broken),
                                       run.Scenario(("warmup",), fine)))
    bench = _bench(tmp_path)
    run._run_steps(bench, {"wide-48p", "warmup"})  # of the first step, wide-48p alone
    assert bench.scenarios["warmup"]["runs"] == {"spark": {"via": "spark"}}
    assert bench.errors == [{"scenario": "wide-48p", "run": "*", "error":
                             "TypeError: unsupported format string passed to "
                             "NoneType.__format__"}]
    failures = render_markdown({"scenarios": bench.scenarios, "errors": bench.errors}
                               ).split("## Failures in this run")[1]
    assert "`wide-48p/*`: TypeError: unsupported format string" in failures


@contextmanager
def _answering(head: bytes) -> Iterator[str]:
    """A server on a free loopback port that answers every request with
    `head` and hangs up: its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                return
            with connection:
                if stop.is_set():
                    return
                connection.recv(65536)
                connection.sendall(head)

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    address = listener.getsockname()
    try:
        yield f"http://127.0.0.1:{address[1]}"
    finally:
        stop.set()
        socket.create_connection(address, timeout=5).close()  # wakes its accept()
        server.join(timeout=10)
        listener.close()


def test_a_light_client_partition_that_breaks_off_is_an_error() -> None:
    """Whatever ends a partition's reading early, the report counts it as an
    error (and the client exits 1), never as a replay of fewer bytes."""
    with _answering(b"HTTP/1.1\r\n\r\n") as url:
        report = light_client.run(url, "bucket", {"0": [{"key": "k", "size": 4096}]},
                                  1024, 5.0)
    assert report["errors"] == 1 and report["bytes"] == 0
    assert "IndexError" in str(report["error_messages"])


def test_the_report_says_whose_peak_rss_its_results_hold() -> None:
    """Results measured before the peak RSS took a server's processes read as
    what they are when the report is made again from them (--report-only)."""
    def results(**marker: str) -> dict[str, object]:
        run = {"mb_per_s": 500.0, "server_peak_rss_bytes": 7 * MiB, **marker}
        return {"scenarios": {"cost-4p": {"rounds": 1, "bytes": 1024 * MiB,
                                          "runs": {"nginx_slice_cold_1": run}}}}

    older = render_markdown(results()).split("## What a replay costs the server")[1]
    newer = render_markdown(results(server_peak_rss_of=cpu.PEAK_RSS_OF)
                            ).split("## What a replay costs the server")[1]
    assert "VmHWM since the server started, of its first process alone" in older
    assert "VmHWM since the server started, summed over its processes" in newer
