"""A latency-sensitive process, cyclictest-style: how late does a 1 ms sleep wake up?

`python -m bench.probe --cpu 0 --seconds 60` pins itself to one CPU
(sched_setaffinity), then sleeps `time.sleep(0.001)` over and over and records
each wake-up's lateness (actual sleep - requested, in microseconds) until it is
sent SIGTERM/SIGINT or `--seconds` pass. It prints `{"event": "ready"}` when it
starts measuring and one JSON line of results when it stops. It runs at the
normal scheduling class and priority (SCHED_OTHER, nice 0), like the broker
beside the sidecar, and with the default timer slack (reported).

The parent side (`Probe`) starts it, waits for the ready line, and around the
measured window reads /proc/stat, so the result says how busy each CPU was
meanwhile and how much of CPU `--cpu`'s busy time was not the probe itself
(other processes, interrupts, kernel threads: the interference), and
/proc/<pid>/stat of every process, so it says how much CPU processes that are
not the benchmark's used meanwhile (`foreign_cpu`): on a shared machine a
window with foreign load measures someone else's work, not the sidecar's.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

INTERVAL_S = 0.001
READY_TIMEOUT_S = 20.0


# --- the probe (child process) ---------------------------------------------------------


def percentiles(samples: list[float]) -> dict[str, float | int | None]:
    """Nearest-rank p50/p90/p99/p99.9, max and mean of samples (one decimal)."""
    ordered = sorted(samples)
    count = len(ordered)

    def rank(q: float) -> float | None:
        if not ordered:
            return None
        index = min(count - 1, max(0, int(q * count + 0.999999) - 1))
        return round(ordered[index], 1)

    return {
        "samples": count,
        "p50": rank(0.50), "p90": rank(0.90), "p99": rank(0.99), "p999": rank(0.999),
        "max": round(ordered[-1], 1) if ordered else None,
        "mean": round(sum(ordered) / count, 1) if ordered else None,
    }


def _timer_slack_ns() -> int | None:
    try:
        return int(Path("/proc/self/timerslack_ns").read_text().strip())
    except (OSError, ValueError):
        return None


def probe_main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probe", description=__doc__)
    parser.add_argument("--cpu", type=int, required=True)
    parser.add_argument("--seconds", type=float, required=True, help="stop after this long")
    args = parser.parse_args(argv)
    os.sched_setaffinity(0, {args.cpu})
    stop = False

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    lateness: list[float] = []
    clock = time.perf_counter_ns
    sleep = time.sleep
    print(json.dumps({"event": "ready", "pid": os.getpid()}), flush=True)
    started = clock()
    cpu_started = time.process_time()
    deadline = started + int(args.seconds * 1e9)
    now = started
    while not stop and now < deadline:
        before = clock()
        sleep(INTERVAL_S)
        now = clock()
        if not stop:  # the wake-up a signal cut short is not a sample
            lateness.append((now - before) / 1000.0 - INTERVAL_S * 1e6)
    result: dict[str, Any] = {
        "event": "result", "cpu": args.cpu, "interval_us": INTERVAL_S * 1e6,
        "seconds": round((clock() - started) / 1e9, 3),
        "cpu_seconds": round(time.process_time() - cpu_started, 3),
        "affinity": sorted(os.sched_getaffinity(0)),
        "timer_slack_ns": _timer_slack_ns(),
        "lateness_us": percentiles(lateness),
    }
    print(json.dumps(result), flush=True)
    return 0


# --- the parent side -------------------------------------------------------------------


@dataclass(frozen=True)
class CpuTimes:
    """Jiffies of one CPU from /proc/stat."""

    busy: int  # everything but idle and iowait (steal included: the vCPU did not run us)
    steal: int
    total: int


def read_cpu_times() -> dict[int, CpuTimes]:
    times: dict[int, CpuTimes] = {}
    for line in Path("/proc/stat").read_text().splitlines():
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu":
            continue
        values = [int(value) for value in fields[:8]] + [0] * (8 - len(fields[:8]))
        user, nice, system, idle, iowait, irq, softirq, steal = values
        total = user + nice + system + idle + iowait + irq + softirq + steal
        times[int(name[3:])] = CpuTimes(total - idle - iowait, steal, total)
    return times


def cpu_usage(before: dict[int, CpuTimes], after: dict[int, CpuTimes]) -> dict[str, Any]:
    """{cpu: {busy, steal}} as fractions of the window, per CPU."""
    usage: dict[str, Any] = {}
    for cpu, end in sorted(after.items()):
        start = before.get(cpu)
        if start is None or end.total <= start.total:
            continue
        total = end.total - start.total
        usage[str(cpu)] = {
            "busy": round((end.busy - start.busy) / total, 4),
            "steal": round((end.steal - start.steal) / total, 4),
        }
    return usage


class Probe:
    """One probe run: `start()`, let things happen, `stop()` -> its results."""

    def __init__(self, cpu: int, max_seconds: float, log: Path) -> None:
        self.cpu = cpu
        self.max_seconds = max_seconds
        self.log = log
        self._process: subprocess.Popen[str] | None = None
        self._before: dict[int, CpuTimes] = {}
        self._processes: dict[int, ProcessTimes] = {}
        self._started = 0.0

    def start(self) -> Probe:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "bench.probe", "--cpu", str(self.cpu),
             "--seconds", str(self.max_seconds)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, start_new_session=True,
        )
        assert self._process.stdout is not None
        ready, _, _ = select.select([self._process.stdout], [], [], READY_TIMEOUT_S)
        line = self._process.stdout.readline() if ready else ""
        if '"ready"' not in line:
            self.kill()
            raise RuntimeError(f"the latency probe did not start: {line!r}")
        self._processes = read_process_times()
        self._before = read_cpu_times()
        self._started = time.monotonic()
        return self

    def stop(self) -> dict[str, Any]:
        process = self._process
        if process is None:
            raise RuntimeError("the latency probe is not running")
        after = read_cpu_times()
        window = time.monotonic() - self._started
        processes = read_process_times()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            stdout, stderr = process.communicate(timeout=30)
        finally:
            self.kill()
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text(f"--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
        result: dict[str, Any] | None = None
        for line in stdout.splitlines():
            if line.startswith("{") and '"result"' in line:
                result = json.loads(line)
        if result is None:
            raise RuntimeError(f"the latency probe exited {process.returncode} without a "
                               f"result: {stderr[-2000:]}")
        usage = cpu_usage(self._before, after)
        result["window_seconds"] = round(window, 3)
        result["cpu_usage"] = usage
        own = usage.get(str(self.cpu))
        if own is not None and window > 0:
            # What else ran on the probe's CPU: its busy share minus the probe itself.
            result["probe_cpu_other_busy"] = round(
                max(0.0, own["busy"] - result["cpu_seconds"] / window), 4)
        result["foreign_cpu"] = foreign_cpu(self._processes, processes, os.getpid(), window)
        result["loadavg"] = _loadavg()
        return result

    def kill(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait(timeout=30)


@dataclass(frozen=True)
class ProcessTimes:
    parent: int
    ticks: int  # utime + stime + cutime + cstime: itself and its reaped children
    started: int  # starttime, to tell a reused pid from the same process
    name: str


def read_process_times() -> dict[int, ProcessTimes]:
    """Every process's CPU ticks from /proc/<pid>/stat."""
    found: dict[int, ProcessTimes] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1:text.rfind(")")]
        fields = text[text.rfind(")") + 2:].split()
        try:
            # after "(comm) ": state 0, ppid 1, ... utime 11, stime 12, cutime 13,
            # cstime 14, ..., starttime 19
            ticks = sum(int(value) for value in fields[11:15])
            found[int(entry.name)] = ProcessTimes(int(fields[1]), ticks, int(fields[19]), name)
        except (IndexError, ValueError):
            continue
    return found


def _descendants(root: int, table: dict[int, ProcessTimes]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, times in table.items():
        children.setdefault(times.parent, []).append(pid)
    found, todo = {root}, [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def foreign_cpu(before: dict[int, ProcessTimes], after: dict[int, ProcessTimes], root: int,
                window_s: float) -> dict[str, Any]:
    """CPU (in cores) used over the window by processes outside `root`'s tree.

    Short-lived processes count through their parent's cutime/cstime once reaped
    (a test runner's children); kernel threads (children of kthreadd) are
    counted apart: they may be working for us (writeback of the slab file).
    """
    ours = _descendants(root, before) | _descendants(root, after)
    hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    user = kernel = 0
    top: list[tuple[int, str]] = []
    for pid, end in after.items():
        if pid in ours:
            continue
        start = before.get(pid)
        used = end.ticks - (start.ticks if start and start.started == end.started else 0)
        if used <= 0:
            continue
        if end.parent == 2 or pid == 2:
            kernel += used
        else:
            user += used
            top.append((used, f"{end.name}[{pid}]"))
    top.sort(reverse=True)
    window_s = max(window_s, 1e-6)
    return {
        "cores": round(user / hz / window_s, 4),
        "kernel_threads_cores": round(kernel / hz / window_s, 4),
        "top": [f"{name} {ticks / hz / window_s:.3f}" for ticks, name in top[:3]],
    }


def _loadavg() -> str | None:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return None


def affinity_of(pid: int | None) -> list[int] | None:
    """The CPUs a process and all its threads may run on (union), or None."""
    if pid is None:
        return None
    cpus: set[int] = set()
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            cpus.update(os.sched_getaffinity(int(task.name)))
    except (OSError, ValueError):
        return None
    return sorted(cpus)


def group_affinity(pgid: int | None) -> list[int] | None:
    """Union of the affinities of every process in a process group (nginx and its workers)."""
    if pgid is None:
        return None
    cpus: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if os.getpgid(int(entry.name)) != pgid:
                continue
        except (ProcessLookupError, PermissionError):
            continue
        found = affinity_of(int(entry.name))
        if found:
            cpus.update(found)
    return sorted(cpus) or None


if __name__ == "__main__":
    sys.exit(probe_main())
