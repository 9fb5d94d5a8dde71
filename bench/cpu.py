"""What a server process costs, read from /proc around a scenario: CPU-seconds
(user and system, all threads, and the process's children such as nginx's
workers, those that ended meanwhile too), minor page faults, and peak resident
memory (the process's and its children's); and per thread, which kind of
thread took the CPU and how often threads were switched out.

proc(5): /proc/PID/stat fields 10 (minflt), 14 (utime) and 15 (stime) in clock
ticks, counted over every thread of the process, and 11, 16 and 17 (cminflt,
cutime, cstime) for its children that ended and were waited for;
/proc/PID/status VmHWM is the peak resident set. Per thread:
/proc/PID/task/TID/schedstat's first field, the nanoseconds it ran
(sched-stats.rst; a thread's utime and stime in its stat are scaled from
sampled ticks and, summed over 38 threads of a cold replay, came to 0.3 CPU-s
a GiB short of the process's figure, while the
schedstat sum matched it), its comm (the sidecar names its threads for the
kernel, sidecar.telemetry.thread_names) and its status
(voluntary_ctxt_switches: the thread waited, for a lock, the GIL, a queue or
I/O; nonvoluntary: it was preempted).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from sidecar.telemetry.thread_cpu import read_threads

_TICKS = os.sysconf("SC_CLK_TCK")
_GIB = 1024 ** 3


@dataclass(frozen=True)
class Usage:
    user_s: float
    system_s: float
    minor_faults: int

    def __sub__(self, other: Usage) -> Usage:
        return Usage(self.user_s - other.user_s, self.system_s - other.system_s,
                     self.minor_faults - other.minor_faults)

    def per_gib(self, delivered: int) -> dict[str, float | None]:
        gib = delivered / _GIB
        if gib <= 0:
            return {"user": None, "system": None, "total": None, "minor_faults": None}
        return {
            "user": round(self.user_s / gib, 3),
            "system": round(self.system_s / gib, 3),
            "total": round((self.user_s + self.system_s) / gib, 3),
            "minor_faults": round(self.minor_faults / gib),
        }


def _stat_fields(pid: int) -> list[str]:
    text = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may hold spaces; everything after its ")" splits.
    return text[text.rindex(")") + 2:].split()


def family(pid: int) -> list[int]:
    """The process and its descendants (nginx's master and workers)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int(_stat_fields(int(entry.name))[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, ()))
    return found


def usage(pid: int) -> Usage:
    """CPU and minor faults of the process, its threads and its descendants:
    those alive, and those that ended and were waited for (a worker or a
    cache loader that exits meanwhile), whose figures the kernel adds to
    their parent's cutime, cstime and cminflt."""
    user = system = faults = 0
    for member in family(pid):
        try:
            fields = _stat_fields(member)
        except OSError:
            continue  # gone meanwhile
        # After "pid (comm) ", field 3 (state) is index 0: minflt is field 10,
        # cminflt 11, utime 14, stime 15, cutime 16, cstime 17.
        faults += int(fields[7]) + int(fields[8])
        user += int(fields[11]) + int(fields[13])
        system += int(fields[12]) + int(fields[14])
    return Usage(user / _TICKS, system / _TICKS, faults)


#: What `peak_rss_bytes` adds up, as the results record it beside the figure.
PEAK_RSS_OF = "processes"


def peak_rss_bytes(pid: int) -> int | None:
    """The peak resident set of the process and its live descendants, each
    one's VmHWM summed (nginx's memory is its workers', not its master's);
    None when the process is gone."""
    peaks = [peak for member in family(pid) if (peak := _own_peak_rss(member)) is not None]
    return sum(peaks) if peaks else None


def _own_peak_rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class ThreadUsage:
    kind: str
    cpu_s: float
    voluntary_switches: int
    involuntary_switches: int


def threads(pid: int) -> dict[int, ThreadUsage]:
    """Each live thread of the process (not its children), by thread id, with
    its kind as the sidecar's own metric names it (`event-loop`, `origin`,
    `io`, ..., `other` for threads left with the process's name)."""
    found: dict[int, ThreadUsage] = {}
    for tid, (kind, seconds) in read_threads(Path(f"/proc/{pid}/task"), pid).items():
        try:
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # gone meanwhile
        switches = {name: int(value) for name, _, value in
                    (line.partition(":\t") for line in status.splitlines())
                    if name in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")}
        found[tid] = ThreadUsage(kind, seconds, switches.get("voluntary_ctxt_switches", 0),
                                 switches.get("nonvoluntary_ctxt_switches", 0))
    return found


def by_kind(before: dict[int, ThreadUsage], after: dict[int, ThreadUsage],
            delivered: int) -> dict[str, dict[str, float]]:
    """Per kind of thread, per GiB delivered between the two readings: CPU
    seconds and context switches (voluntary and not). A thread that started
    meanwhile counts from zero; one that ended meanwhile is missing (its CPU
    is still in the process's total)."""
    gib = delivered / _GIB
    if gib <= 0:
        return {}
    kinds: dict[str, list[float]] = {}
    for tid, now in after.items():
        then = before.get(tid)
        if then is not None and then.kind != now.kind:
            then = None  # the id was reused by another thread
        cpu = now.cpu_s - (then.cpu_s if then else 0.0)
        voluntary = now.voluntary_switches - (then.voluntary_switches if then else 0)
        involuntary = now.involuntary_switches - (then.involuntary_switches if then else 0)
        sums = kinds.setdefault(now.kind, [0.0, 0.0, 0.0])
        sums[0] += cpu
        sums[1] += voluntary
        sums[2] += involuntary
    return {kind: {"cpu_s": round(cpu / gib, 3), "voluntary_switches": round(vol / gib),
                   "involuntary_switches": round(invol / gib)}
            for kind, (cpu, vol, invol) in sorted(kinds.items())}
