"""CPU pinning against a kernel whose cpuset holds fewer CPUs than the machine,
and an I/O priority the kernel refuses.

sched_setaffinity(2) keeps only the cpuset's CPUs of the mask it is given and
fails with EINVAL when none is left; a fake of those two calls stands in for a
container's cgroup, which a test cannot create unprivileged.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable
from pathlib import Path

import psutil
import pytest

from sidecar.errors import ConfigError
from sidecar.isolation import host


class CpusetKernel:
    def __init__(self, cpuset: set[int]) -> None:
        self.cpuset = cpuset
        self.affinity = set(cpuset)

    def setaffinity(self, pid: int, cpus: Iterable[int]) -> None:
        kept = set(cpus) & self.cpuset
        if not kept:
            raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))
        if pid == 0:
            self.affinity = kept

    def getaffinity(self, pid: int) -> set[int]:
        return set(self.affinity)


@pytest.fixture
def kernel(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> CpusetKernel:
    fake = CpusetKernel({0})
    online = tmp_path / "machine-online"
    online.write_text("0-3\n")  # the machine's four CPUs; the cpuset gives it one
    monkeypatch.setattr(host, "ONLINE_CPUS", online, raising=False)
    monkeypatch.setattr(os, "sched_setaffinity", fake.setaffinity)
    monkeypatch.setattr(os, "sched_getaffinity", fake.getaffinity)
    return fake


def test_cpus_outside_the_cpuset_are_a_config_error(kernel: CpusetKernel) -> None:
    with pytest.raises(ConfigError) as caught:
        host.pin_cpus((2,))
    assert str(caught.value) == (
        "cannot pin to --cpus 2: Invalid argument (this process may run on 0)")


def test_cpus_partly_outside_the_cpuset_are_not_dropped_silently(kernel: CpusetKernel) -> None:
    with pytest.raises(ConfigError) as caught:
        host.pin_cpus((0, 1, 3))
    assert str(caught.value) == ("--cpus names CPUs outside this process's cpuset: 1,3 "
                                 "(it may run on 0)")


def test_cpus_inside_the_cpuset_are_pinned(kernel: CpusetKernel) -> None:
    assert host.pin_cpus((0,)) == "cpus: pinned to 0"
    assert kernel.affinity == {0}


def test_io_priority_refused_says_permission_denied(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: psutil.Process, ioclass: int, value: int | None = None) -> None:
        raise psutil.AccessDenied(self.pid)  # what psutil raises for EPERM

    monkeypatch.setattr(psutil.Process, "ionice", refuse)
    with pytest.raises(ConfigError) as caught:
        host.set_io_priority(("realtime", 0))
    assert str(caught.value) == (
        "cannot set I/O priority realtime:0: permission denied "
        "(the realtime class needs CAP_SYS_ADMIN or CAP_SYS_NICE)")


def test_cpus_are_checked_against_the_online_ids_not_their_count(
    kernel: CpusetKernel, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # SMT turned off: eight CPUs, the odd ones offline; four online, ids up to 6.
    online = tmp_path / "online"
    online.write_text("0,2,4,6\n")
    monkeypatch.setattr(host, "ONLINE_CPUS", online, raising=False)
    monkeypatch.setattr(psutil, "cpu_count", lambda logical=True: 4)  # what such a machine says
    kernel.cpuset = kernel.affinity = {0, 2, 4, 6}
    assert host.pin_cpus((4, 6)) == "cpus: pinned to 4,6"
    with pytest.raises(ConfigError) as caught:
        host.pin_cpus((3,))
    assert str(caught.value) == (
        "--cpus names CPUs this machine does not have online: 3 (it has 0,2,4,6)")
