"""What a server process costs, read from /proc around a scenario: CPU-seconds
(user and system, all threads, and the process's children such as nginx's
workers), minor page faults, and peak resident memory.

proc(5): /proc/PID/stat fields 10 (minflt), 14 (utime) and 15 (stime) in clock
ticks, counted over every thread of the process; /proc/PID/status VmHWM is the
peak resident set.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

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
    """CPU and minor faults of the process, its threads and its live descendants."""
    user = system = faults = 0
    for member in family(pid):
        try:
            fields = _stat_fields(member)
        except OSError:
            continue  # gone meanwhile
        # After "pid (comm) ", field 3 (state) is index 0: minflt is field 10,
        # utime 14, stime 15.
        faults += int(fields[7])
        user += int(fields[11])
        system += int(fields[12])
    return Usage(user / _TICKS, system / _TICKS, faults)


def peak_rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
