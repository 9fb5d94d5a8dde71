"""How long the capacity analysis takes on a large access log, and its peak memory.

    python -m bench.capacity_scale --requests 20000000 [--nodes 4] [--skip-standalone]

Writes a synthetic access log (the sidecar's line format, sidecar/telemetry/
access_log.py) of REQUESTS object reads: Kafka consumers reading partitions'
segments front to back in 1 MiB fetches (`bytes=pos-`), some groups re-reading
what others read earlier, spread over NODES nodes. Then times
`python -m spark_warmup.capacity` on it with `--master local[2]` and on a
standalone master and worker started from the pyspark package, and records the
wall time and the peak resident memory of the driver and of every JVM and
Python worker it started (sampled from /proc). Results go to
bench/results/capacity-scale.json and bench/results/capacity-scale.md, the
section BENCHMARKS.md includes.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.machine import machine_info
from bench.stopping import unwind_on_signals
from tests.support.spark_cluster import StandaloneCluster

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
MiB = 1024 * 1024
BLOCK = 8 * MiB
SEGMENT = 512 * MiB
FETCH = MiB
CACHE = 256 * 1024 ** 3


def uuid22(rng: random.Random) -> str:
    return base64.urlsafe_b64encode(rng.randbytes(16)).decode()[:22]


def _lines(requests: int, nodes: int, seed: int) -> Iterator[str]:
    """Kafka consumers on each node, 48 at a time, read partitions' segments front
    to back, one 1 MiB fetch (`bytes=pos-`) per request; a consumer that is done
    gives way to one starting at a random segment, so later consumers re-read what
    earlier ones read, as a replaying group or a lagging consumer does."""
    rng = random.Random(seed)
    start = 1_790_000_000.0
    span = 6 * 3600.0
    # Aiven's layout: {topic}-{topicId}/{partition}/{offset:020d}-{segmentId}.log, ids
    # as 22 characters of URL-safe base64.
    topics = [f"topic{t:02d}-{uuid22(rng)}" for t in range(24)]
    segment_ids = [uuid22(rng) for _ in range(64)]
    fetches = SEGMENT // FETCH

    def new_consumer() -> list[Any]:
        topic = topics[int(rng.paretovariate(1.2)) % len(topics)]
        # topic, partition, segment, fetch number, fetches left
        return [topic, rng.randrange(12), rng.randrange(40), 0, rng.randrange(64, 4096)]

    consumers = [[new_consumer() for _ in range(48)] for _ in range(nodes)]
    for number in range(requests):
        node = number % nodes
        consumer = rng.choice(consumers[node])
        topic, partition, segment, fetch, _ = consumer
        key = (f"{topic}/{partition}/{segment * 1_000_000:020d}-"
               f"{segment_ids[(segment + partition) % len(segment_ids)]}.log")
        position = fetch * FETCH
        first = position // BLOCK
        found = "c" if rng.random() < 0.8 else "f"
        now = start + span * number / requests
        stamp = datetime.fromtimestamp(now, UTC).isoformat(timespec="milliseconds")
        yield (
            f'{{"node":"broker-{node}","time":"{stamp[:-6]}Z","request_id":"{number:016X}",'
            f'"method":"GET","bucket":"tiered","key":"{key}","etag":"\\"e{segment}\\"",'
            f'"object_size":{SEGMENT},"range":"bytes={position}-","first_byte":{position},'
            f'"last_byte":{SEGMENT - 1},"status":206,"bytes":{FETCH},"block_size":{BLOCK},'
            f'"blocks":{{"first":{first},"found":"{found}"}},'
            f'"lane":{"null" if found == "c" else chr(34) + "foreground" + chr(34)},'
            f'"cache":"{"hit" if found == "c" else "miss"}","duration_s":0.002,'
            f'"cache_bytes":{CACHE}}}\n'
        )
        consumer[3] += 1
        consumer[4] -= 1
        if consumer[3] == fetches:
            consumer[2], consumer[3] = consumer[2] + 1, 0
        if consumer[4] <= 0:
            consumers[node][consumers[node].index(consumer)] = new_consumer()


def generate(path: Path, requests: int, nodes: int, seed: int = 7) -> int:
    """Write the log; returns its size in bytes."""
    with open(path, "w", encoding="utf-8", buffering=8 * MiB) as out:
        batch: list[str] = []
        for line in _lines(requests, nodes, seed):
            batch.append(line)
            if len(batch) >= 10000:
                out.write("".join(batch))
                batch.clear()
        out.write("".join(batch))
    return path.stat().st_size


class PeakMemory:
    """Peak summed RSS of a process and all its descendants, sampled from /proc."""

    def __init__(self, pid: int, interval_s: float = 0.5) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.peak_bytes = max(self.peak_bytes, self._tree_rss())

    def _tree_rss(self) -> int:
        children: dict[int, list[int]] = {}
        rss: dict[int, int] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
                status = Path(f"/proc/{entry}/status").read_text()
            except OSError:
                continue
            parent = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(parent, []).append(int(entry))
            for line in status.splitlines():
                if line.startswith("VmRSS:"):
                    rss[int(entry)] = int(line.split()[1]) * 1024
        total, stack = 0, [self.pid]
        while stack:
            pid = stack.pop()
            total += rss.get(pid, 0)
            stack.extend(children.get(pid, ()))
        return total


def _group_gone(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether the job's whole process group (its driver and the JVM the driver
    started) is gone within ``timeout_s``: the driver first, then its JVM,
    which may still be exiting when the driver is."""
    deadline = time.monotonic() + timeout_s
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    while time.monotonic() < deadline:
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def time_job(log: Path, report: Path, master: str, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "spark_warmup.capacity", "--logs", str(log), "--report",
               str(report), "--master", master, "--conf", "spark.ui.enabled=false", *extra]
    started = time.monotonic()
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}
    with open(report.parent / f"{report.name}.log", "wb") as out:
        # A process group of its own: the job and the JVM it starts stop together.
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                   env=env, start_new_session=True)
        try:
            with PeakMemory(process.pid) as memory:
                code = process.wait()
        finally:
            if process.poll() is None:  # interrupted: the job goes too
                os.killpg(process.pid, signal.SIGTERM)
                if not _group_gone(process, 30):
                    os.killpg(process.pid, signal.SIGKILL)
                    _group_gone(process, 30)
    seconds = time.monotonic() - started
    summary = json.loads((report / "summary.json").read_text()) if code == 0 else {}
    return {"master": master, "exit_code": code, "seconds": round(seconds, 1),
            "peak_rss_bytes": memory.peak_bytes,
            "reads": (summary.get("lines") or {}).get("reads"),
            "nodes": len(summary.get("nodes") or {}),
            "sample_rate": min((n["sample_rate"] for n in (summary.get("nodes") or {}).values()),
                               default=None),
            "curve_points": sum(len(n["curve"]) for n in (summary.get("nodes") or {}).values())}


def render(result: dict[str, Any]) -> str:
    machine = result["machine"]
    rows = [f"| {run['where']} | {run['seconds']:.0f} s | "
            f"{run['peak_rss_bytes'] / 1024 ** 3:.2f} GiB | {run['reads']} | "
            f"{run['sample_rate']:.4f} | {run['curve_points']} | "
            f"{'ok' if run['exit_code'] == 0 else 'exit ' + str(run['exit_code'])} |"
            for run in result["runs"]]
    return "\n".join([
        "## Capacity analysis at scale\n",
        f"`{result['command']}`, {result['date']} (UTC), on {machine.get('cpu_model', '?')}, "
        f"{machine.get('cores', '?')} cores, {machine.get('ram_gib', '?')} GiB RAM (shared "
        "with other work). A synthetic access log of "
        f"{result['requests']:,} object reads ({result['log_bytes'] / 1024 ** 3:.1f} GiB, "
        f"{result['nodes']} nodes, generated in {result['generate_s']:.0f} s) analysed by "
        "`python -m spark_warmup.capacity`; each node's curve replays at most "
        f"{result['max_trace']:,} reads (partitions sampled by hash). Peak memory: the "
        "summed RSS of the process tree the command starts, sampled from /proc every "
        "0.5 s: with `local[2]` the driver, its JVM and the Python workers doing all the "
        "work; on the standalone cluster the driver and its JVM only (the executors run "
        "under the worker's JVM, a tree of their own, not counted).\n",
        "| where | wall time | peak memory | reads parsed | sample rate | curve points | "
        "result |",
        "|---|---|---|---|---|---|---|",
        *rows, "",
    ])


def _without_paths(argv: list[str], hidden: tuple[str, ...] = ("--work", "--results")
                   ) -> list[str]:
    """The command line as a reader can repeat it: without this run's own paths."""
    shown: list[str] = []
    value_next = False
    for arg in argv:
        if value_next:
            value_next = False
        elif arg in hidden:
            value_next = True
        elif arg.split("=", 1)[0] not in hidden:
            shown.append(arg)
    return shown


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity_scale")
    parser.add_argument("--requests", type=int, default=20_000_000)
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--max-trace", type=int, default=500_000)
    parser.add_argument("--skip-standalone", action="store_true")
    parser.add_argument("--work", type=Path, default=None,
                        help="where the log and reports go (default: a temporary directory)")
    parser.add_argument("--results", type=Path, default=RESULTS,
                        help="where capacity-scale.json and .md go (default: bench/results)")
    args = parser.parse_args(argv)
    unwind_on_signals()
    work = args.work or Path(tempfile.mkdtemp(prefix="capacity-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        log = work / "access.log"
        started = time.monotonic()
        log_bytes = generate(log, args.requests, args.nodes)
        generate_s = time.monotonic() - started
        print(f"generated {args.requests} lines, {log_bytes} bytes in {generate_s:.0f} s",
              flush=True)
        extra = ["--max-trace", str(args.max_trace), "--conf", "spark.driver.memory=2g"]
        runs = []
        run = time_job(log, work / "report-local", "local[2]", extra)
        runs.append({"where": "`--master local[2]`", **run})
        print(json.dumps(run), flush=True)
        if not args.skip_standalone:
            with StandaloneCluster(work, cores=2, memory="4g") as cluster:
                run = time_job(log, work / "report-standalone", cluster.url,
                               [*extra, "--conf", "spark.executor.memory=2g",
                                "--conf", "spark.driver.host=127.0.0.1",
                                "--conf", "spark.driver.bindAddress=127.0.0.1"])
            runs.append({"where": "standalone master + worker (2 cores)", **run})
            print(json.dumps(run), flush=True)
        command = "python -m bench.capacity_scale " + " ".join(
            _without_paths(argv if argv is not None else sys.argv[1:]))
        result = {"command": command.strip(),
                  "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
                  "machine": machine_info(ROOT), "requests": args.requests, "nodes": args.nodes,
                  "max_trace": args.max_trace, "log_bytes": log_bytes,
                  "generate_s": generate_s, "runs": runs}
        args.results.mkdir(parents=True, exist_ok=True)
        (args.results / "capacity-scale.json").write_text(json.dumps(result, indent=1) + "\n")
        (args.results / "capacity-scale.md").write_text(render(result))
    finally:
        # A log of millions of lines goes, whether the run ended or was stopped.
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
