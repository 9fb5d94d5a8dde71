"""The scale benchmark of the capacity analysis (bench/capacity_scale.py), stopped.

A scale run writes a log of millions of lines to a temporary directory and
starts a Spark job (a Python driver and its JVM) on it. Stopped by SIGTERM, as
a CI runner or an operator's shell stops it, it must take both with it: the job
in its own process group, the log deleted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from bench.capacity_scale import _without_paths
from tests.support.processes import kill_group
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]


def test_a_scale_run_stopped_by_sigterm_stops_its_spark_job_and_deletes_its_log(
    tmp_path: Path,
) -> None:
    temp, results = tmp_path / "temp", tmp_path / "results"
    temp.mkdir()
    run = subprocess.Popen(
        [sys.executable, "-m", "bench.capacity_scale", "--requests", "20000", "--nodes", "1",
         "--skip-standalone", "--results", str(results)],
        cwd=ROOT, env={**os.environ, "TMPDIR": str(temp)}, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        parent = psutil.Process(run.pid)

        def job_jvm() -> list[psutil.Process] | None:
            children = parent.children(recursive=True)
            try:
                up = any(child.name() == "java" and "org.apache.spark" in " ".join(
                    child.cmdline()) for child in children)
            except psutil.Error:  # one came and went meanwhile
                return None
            return children if up else None

        processes = eventually(job_jvm, "the analysis' Spark JVM", timeout=120)
        assert list(temp.glob("capacity-scale-*/access.log"))  # the log it wrote
        run.send_signal(signal.SIGTERM)
        assert run.wait(timeout=60) != 0
        assert [p.pid for p in processes if p.is_running() and p.status() != "zombie"] == []
        assert list(temp.glob("capacity-scale-*")) == []
        assert not results.exists()  # nothing measured, nothing written
    finally:
        kill_group(run)


def test_the_command_a_scale_run_records_leaves_out_its_own_paths() -> None:
    assert _without_paths(["--requests", "5", "--work", "/tmp/w", "--results=/tmp/r",
                           "--skip-standalone"]) == ["--requests", "5", "--skip-standalone"]
