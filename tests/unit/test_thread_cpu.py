"""sidecar_thread_cpu_seconds_total: CPU time by kind of thread, from a /proc tree."""

from __future__ import annotations

import shutil
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest

from sidecar.telemetry.thread_cpu import ThreadCpuCollector, thread_kind

PID = 100


def task(tasks: Path, tid: int, comm: str, seconds: float) -> None:
    entry = tasks / str(tid)
    entry.mkdir(parents=True, exist_ok=True)
    (entry / "comm").write_text(comm + "\n")
    (entry / "schedstat").write_text(f"{int(seconds * 1e9)} 12345 67\n")


def test_a_threads_kind_is_its_name_less_its_number() -> None:
    assert thread_kind("sidecar", "sidecar", is_main=True) == "event-loop"
    assert thread_kind("origin-12", "sidecar", is_main=False) == "origin"
    assert thread_kind("io_3", "sidecar", is_main=False) == "io"
    assert thread_kind("access-log", "sidecar", is_main=False) == "access-log"
    # Left with the process's name: a library's thread.
    assert thread_kind("python", "python", is_main=False) == "other"


def test_seconds_are_summed_by_kind_and_never_go_down(tmp_path: Path) -> None:
    tasks = tmp_path / "task"
    task(tasks, PID, "sidecar", 2.0)
    task(tasks, 101, "origin-0", 1.5)
    task(tasks, 102, "sidecar", 0.25)
    collector = ThreadCpuCollector(tasks=tasks, pid=PID)
    assert collector.seconds_by_kind() == {"event-loop": 2.0, "origin": 1.5, "other": 0.25}

    shutil.rmtree(tasks / "101")  # the thread ended: what it used stays counted
    task(tasks, 103, "origin-1", 0.5)
    task(tasks, 102, "io_0", 0.125)  # its id taken by a new thread of another kind
    assert collector.seconds_by_kind() == {
        "event-loop": 2.0, "origin": 2.0, "other": 0.25, "io": 0.125}


def test_the_metric_is_exported_with_a_series_per_kind(tmp_path: Path) -> None:
    tasks = tmp_path / "task"
    task(tasks, PID, "sidecar", 3.0)
    task(tasks, 104, "origin-2", 0.75)
    registry = CollectorRegistry()
    ThreadCpuCollector(registry, tasks=tasks, pid=PID)
    text = generate_latest(registry).decode()
    assert 'sidecar_thread_cpu_seconds_total{thread="event-loop"} 3.0' in text
    assert 'sidecar_thread_cpu_seconds_total{thread="origin"} 0.75' in text


def test_no_proc_tree_means_no_series(tmp_path: Path) -> None:
    collector = ThreadCpuCollector(tasks=tmp_path / "missing", pid=PID)
    assert collector.seconds_by_kind() == {}
