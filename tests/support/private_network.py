"""A network namespace of its own, for a test server that must bind off loopback.

The admin port guards its pages when it listens on a non-loopback address
(0.0.0.0 in a pod). A test that binds 0.0.0.0 in the machine's own namespace
would be reachable from every interface for its duration; in a new network
namespace (util-linux's `unshare --net`) the only interface is that namespace's
own loopback, which nothing outside it reaches. `PrivateNetwork` holds one open
with a sleeping process; servers start in it through `nsenter`, and the test
talks to them from a thread that joined it (setns(2) is per thread for network
namespaces). Needs root, as the loop disks of the disk-fault tests do.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

from tests.support.waiting import eventually

T = TypeVar("T")

CLONE_NEWNET = 0x40000000  # <linux/sched.h>



class PrivateNetwork:
    """A new network namespace with its loopback up, for as long as this is entered.

    `prefix` runs a command in it; `run(work)` runs `work()` on a thread in it."""

    def __init__(self) -> None:
        self._holder: subprocess.Popen[bytes] | None = None
        self.prefix: tuple[str, ...] = ()

    def __enter__(self) -> PrivateNetwork:
        self._holder = subprocess.Popen(
            ["unshare", "--net", "--", "sh", "-c", "ip link set lo up && exec sleep 3600"],
            start_new_session=True)
        pid = self._holder.pid

        def up() -> bool | None:
            assert self._holder is not None
            if self._holder.poll() is not None:
                raise AssertionError(f"unshare --net exited with {self._holder.returncode}")
            with open(f"/proc/{pid}/comm", encoding="ascii") as comm:
                return True if comm.read().strip() == "sleep" else None

        try:
            eventually(up, "the private network's loopback", 10.0, 0.02)
        except BaseException:
            self.close()
            raise
        self.prefix = ("nsenter", f"--net=/proc/{pid}/ns/net", "--")
        return self

    def run(self, work: Callable[[], T], timeout: float = 60.0) -> T:
        assert self._holder is not None
        return in_network_of(self._holder.pid, work, timeout)

    def close(self) -> None:
        if self._holder is not None and self._holder.poll() is None:
            os.killpg(self._holder.pid, signal.SIGKILL)
            self._holder.wait()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def join_network_of(pid: int) -> None:
    """Move the calling thread into the network namespace of process `pid`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise OSError(errno, f"setns into the network of {pid}: {os.strerror(errno)}")
    finally:
        os.close(fd)


def in_network_of(pid: int, work: Callable[[], T], timeout: float = 60.0) -> T:
    """`work()` run on a thread that joined the network namespace of process `pid`."""
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            join_network_of(pid)
            outcome.append(work())
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=run, name=f"netns-{pid}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise TimeoutError(f"work in the network of {pid} took over {timeout} s")
    if failure:
        raise failure[0]
    return outcome[0]
