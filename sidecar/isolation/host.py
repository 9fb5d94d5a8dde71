"""CPU pinning, I/O priority and niceness of the sidecar process.

The broker beside the sidecar owns the node: a catch-up replay must run on the
cores and at the I/O priority the operator leaves to it. Pinning, niceness and
I/O priority are applied to every thread the process already has (Linux keeps
all three per thread); threads started later (the disk executor, aiobotocore's)
inherit them from the thread that starts them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import psutil

from sidecar.errors import ConfigError

# Documented in the kernel's Documentation/ABI/testing/sysfs-devices-system-cpu.
ONLINE_CPUS = Path("/sys/devices/system/cpu/online")

_IONICE_CLASSES = {
    "realtime": psutil.IOPRIO_CLASS_RT,
    "best-effort": psutil.IOPRIO_CLASS_BE,
    "idle": psutil.IOPRIO_CLASS_IDLE,
}


def pin_cpus(cpus: tuple[int, ...] | None) -> str:
    if cpus is None:
        return "cpus: not pinned"
    available = online_cpus()
    unknown = sorted(set(cpus) - available)
    if unknown:
        named = ", ".join(map(str, unknown[:5])) + (f" and {len(unknown) - 5} more"
                                                    if len(unknown) > 5 else "")
        raise ConfigError(f"--cpus names CPUs this machine does not have online: {named} "
                          f"(it has {_listed(available)})")
    # sched_setaffinity(2): the kernel keeps only the CPUs of the cgroup's
    # cpuset (a container given fewer CPUs than the machine has), silently,
    # and refuses with EINVAL when none is left; EPERM when not allowed.
    try:
        os.sched_setaffinity(0, cpus)
        refused = sorted(set(cpus) - os.sched_getaffinity(0))
    except OSError as exc:
        raise ConfigError(f"cannot pin to --cpus {_listed(cpus)}: {exc.strerror} "
                          f"(this process may run on {_listed(os.sched_getaffinity(0))})"
                          ) from None
    if refused:
        raise ConfigError(f"--cpus names CPUs outside this process's cpuset: "
                          f"{_listed(refused)} (it may run on "
                          f"{_listed(os.sched_getaffinity(0))})")
    for thread_id in _thread_ids():
        try:
            os.sched_setaffinity(thread_id, cpus)
        except ProcessLookupError:  # the thread ended since it was listed
            continue
    return f"cpus: pinned to {','.join(map(str, cpus))}"


def online_cpus() -> set[int]:
    """The ids of the CPUs online, from the kernel's list (e.g. `0,2,4-7`).

    Not range(cpu_count()): the count is of CPUs online, and with some
    offline (SMT turned off leaves every other id) the ids are not 0..count-1."""
    online: set[int] = set()
    try:
        for part in ONLINE_CPUS.read_text(encoding="ascii").strip().split(","):
            first, _, last = part.partition("-")
            online.update(range(int(first), int(last or first) + 1))
    except (OSError, ValueError):  # no sysfs (or not Linux's): the count it is
        return set(range(psutil.cpu_count() or 1))
    return online


def _listed(cpus: Iterable[int]) -> str:
    """CPU ids as the kernel lists them: runs as ranges, `0-3,6`."""
    runs: list[list[int]] = []
    for cpu in sorted(set(cpus)):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def set_io_priority(ionice: tuple[str, int] | None) -> str:
    if ionice is None:
        return "ionice: unchanged"
    name, level = ionice
    try:
        for thread_id in _thread_ids():
            try:
                if name == "idle":
                    psutil.Process(thread_id).ionice(_IONICE_CLASSES[name])
                else:
                    psutil.Process(thread_id).ionice(_IONICE_CLASSES[name], level)
            except psutil.NoSuchProcess:  # the thread ended since it was listed
                continue
    except psutil.AccessDenied:
        # ioprio_set(2): the realtime class needs CAP_SYS_ADMIN (or CAP_SYS_NICE).
        raise ConfigError(f"cannot set I/O priority {name}:{level}: permission denied "
                          "(the realtime class needs CAP_SYS_ADMIN or CAP_SYS_NICE)") from None
    except OSError as exc:
        raise ConfigError(f"cannot set I/O priority {name}:{level}: {exc.strerror}") from None
    except psutil.Error as exc:
        raise ConfigError(f"cannot set I/O priority {name}:{level}: {exc}") from None
    return f"ionice: {name}" + ("" if name == "idle" else f":{level}")


def set_nice(nice: int) -> str:
    if nice == 0:
        return "nice: unchanged"
    try:
        for thread_id in _thread_ids():
            try:
                os.setpriority(os.PRIO_PROCESS, thread_id, nice)
            except ProcessLookupError:  # the thread ended since it was listed
                continue
    except OSError as exc:
        raise ConfigError(f"cannot set nice {nice}: {exc.strerror}") from None
    return f"nice: {nice}"


def _thread_ids() -> list[int]:
    """The process's threads, its main thread first: on Linux both niceness
    (pthreads(7), setpriority(2)) and I/O priority (ioprio_set(2)) belong to
    one thread, and only threads started later inherit them from their starter."""
    own = os.getpid()
    return [own] + [thread.id for thread in psutil.Process().threads() if thread.id != own]


def apply_host_settings(
    cpus: tuple[int, ...] | None, ionice: tuple[str, int] | None, nice: int
) -> str:
    """Apply all three; returns what was applied, for the start-up summary."""
    return "; ".join([pin_cpus(cpus), set_io_priority(ionice), set_nice(nice)])
