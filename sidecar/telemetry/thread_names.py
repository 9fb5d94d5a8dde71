"""The sidecar's threads, named for the OS as well as for Python.

Python names its threads for itself only (before 3.14); the kernel keeps
calling every one of them after the process. Named with prctl(2)
PR_SET_NAME, each shows in `top -H`, `ps -L -o tid,comm,pcpu` and
/proc/PID/task/TID/comm as what it does: `origin-N` (block GETs from the
object store), `io_N` (cache disk reads and writes), `access-log`, and the
event loop under the process's own name. An operator sees at a glance which
part of the sidecar takes the broker's CPU; `python -m bench` splits the
sidecar's CPU per GiB the same way.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from collections.abc import Callable

# prctl(2): PR_SET_NAME, and the kernel's TASK_COMM_LEN (16) less the NUL.
_PR_SET_NAME = 15
MAX_NAME_BYTES = 15
# Every thread of the process is the sidecar's: the prefix tells nothing there.
_PREFIX = "sidecar-"


def os_name(python_name: str) -> str:
    """What the kernel is told for a thread named `python_name`: without the
    `sidecar-` prefix, cut to what the kernel keeps."""
    name = python_name.removeprefix(_PREFIX)
    return name.encode("utf-8")[:MAX_NAME_BYTES].decode("utf-8", "ignore")


def _prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return prctl


_PRCTL = _prctl()


def name_this_thread() -> None:
    """Tell the kernel the calling thread's Python name (see `os_name`). Call
    it first thing in the thread; elsewhere than Linux it does nothing, and a
    name the kernel refuses leaves the old one, which only costs the label."""
    if _PRCTL is None:
        return
    _PRCTL(_PR_SET_NAME, os_name(threading.current_thread().name).encode("utf-8"), 0, 0, 0)
