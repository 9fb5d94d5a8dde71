"""A Spark standalone master and one worker from the pyspark package, on loopback.

What the warm-up and capacity tests run their jobs on, and what
`python -m bench.capacity_scale` times the analysis on: the daemons run from
the installed pyspark (`bin/spark-class`), bound to 127.0.0.1 on free ports,
with their logs in `work`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

import pyspark

from sidecar.tools.ports import free_port
from tests.support.waiting import eventually

SPARK_HOME = Path(pyspark.__file__ or "").parent



class StandaloneCluster:
    """`start()` and `stop()`, or a context manager. `env` is added to the
    daemons' environment (an executor's credentials, say)."""

    def __init__(self, work: Path, cores: int = 1, memory: str = "1g",
                 env: Mapping[str, str] | None = None) -> None:
        self.port, self.ui_port, self.worker_ui_port = free_port(), free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.work, self.cores, self.memory = work, cores, memory
        self.env = dict(env or {})
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        env = {**os.environ, **self.env, "SPARK_HOME": str(SPARK_HOME),
               "SPARK_LOCAL_IP": "127.0.0.1",
               # No REST submission server (it would want the fixed port 6066).
               "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
        spark_class = str(SPARK_HOME / "bin" / "spark-class")
        self._spawn([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                     "--port", str(self.port), "--webui-port", str(self.ui_port)], env, "master")
        try:
            # The master's ports are bound before the worker starts, and the worker's
            # own RPC port is named: a worker left to pick one took the port chosen
            # for the master's UI while the master's JVM was still starting, and the
            # UI moved to the next one, where nothing looked.
            eventually(lambda: self._alive_workers() is not None,
                       f"the Spark master's UI on port {self.ui_port}; logs in {self.work}",
                       timeout=120, interval=0.5)
            self._spawn([spark_class, "org.apache.spark.deploy.worker.Worker", self.url,
                         "--host", "127.0.0.1", "--port", str(free_port()),
                         "--cores", str(self.cores), "--memory", self.memory,
                         "--webui-port", str(self.worker_ui_port),
                         "--work-dir", str(self.work / "worker")], env, "worker")
            eventually(lambda: (self._alive_workers() or 0) >= 1,
                       f"a worker to register with the master; logs in {self.work}",
                       timeout=120, interval=0.5)
        except BaseException:
            self.stop()
            raise

    def _alive_workers(self) -> int | None:
        """The workers the master's UI counts alive; None while it does not answer."""
        if any(p.poll() is not None for p in self.processes):
            raise RuntimeError(f"a Spark daemon exited; logs in {self.work}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/",
                                        timeout=2) as response:
                return int(json.load(response).get("aliveworkers", 0))
        except (OSError, ValueError):
            return None

    def _spawn(self, args: list[str], env: dict[str, str], name: str) -> None:
        with (self.work / f"{name}.log").open("wb") as log:
            self.processes.append(subprocess.Popen(args, env=env, stdout=log,
                                                   stderr=subprocess.STDOUT))

    def stop(self) -> None:
        for process in reversed(self.processes):  # the worker first: it stops its executors
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()

    def __enter__(self) -> StandaloneCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()


def executor_python(tmp_path: Path) -> Path:
    """An interpreter with this venv's libraries but not this project.

    A venv whose .pth adds our site-packages as a plain path: the editable
    install's own .pth (which makes `sidecar` and `spark_warmup` importable) is
    not processed there. Executors using it can only import the job's code from
    the zip the job ships with addPyFile.
    """
    venv = tmp_path / "executor-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = sysconfig.get_paths()["purelib"]
    python = venv / "bin" / "python"
    site_dir = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    Path(site_dir, "main-venv.pth").write_text(packages + "\n")
    probe = subprocess.run([str(python), "-c", "import boto3, pyspark; import spark_warmup"],
                           capture_output=True, text=True, cwd=tmp_path)
    assert "No module named 'spark_warmup'" in probe.stderr, probe.stderr
    return python
