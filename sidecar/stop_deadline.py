"""The stop's deadline: past it, or at a second SIGTERM/SIGINT, the process ends at once.

A stop waits for the disk work under way and then writes the index snapshot to
the cache disk. A cache disk that hangs (an NFS or EBS volume gone away, a
device whose requests never come back: the thread waits in the kernel, in D
state) would hold that stop forever, and the orchestrator would SIGKILL the
process after its grace period (Kubernetes: terminationGracePeriodSeconds, 30 s
by default; systemd: TimeoutStopSec) with no word of why. Past the deadline, one
log record names the step of the stop still waited for, and the process ends
with ``os._exit`` and status 1.

Ending the process is the safe way out: closing the slab under a read still in
the kernel would free its descriptor for reuse, and the read could then land in
another file. Nothing is lost but the index snapshot: the next start finds none
and scans the slot headers, as after a crash (every byte it serves is verified
against its block's checksums either way).

Why a thread of its own and a pipe: the deadline must hold when the event loop
itself is stuck (a call that blocks the loop thread, a loop that never yields),
so it is not a loop timer but a thread waiting in ``select`` on a pipe with the
time left as its timeout. The second signal reaches it through the same pipe: a
Python signal handler runs on the main thread whenever that thread runs Python
code or waits interruptibly (a lock, a join, ``select``), loop or no loop, and
only writes a byte (no lock is taken in the handler, so one it interrupted
cannot deadlock it). A main thread stuck in the kernel itself (an uninterruptible
disk wait) runs no handler at all: then the deadline still ends the process.
A process with a thread in D state becomes a zombie only once that thread leaves
the kernel; SIGKILL could do no better.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable
from types import FrameType

log = logging.getLogger(__name__)

STOP_CUT_SHORT_STATUS = 1
_SECOND_SIGNAL = b"s"
_RECORD_GRACE_S = 2.0


class StopDeadline:
    """Ends the process when the stop outlasts ``deadline_s`` or a second
    signal comes; ``where()`` says what the stop is waiting for (read from
    the watchdog thread: it must only read plain attributes)."""

    def __init__(self, deadline_s: float, where: Callable[[], str],
                 end_process: Callable[[int], object] = os._exit,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._deadline_s = deadline_s
        self._where = where
        self._end = end_process
        self._clock = clock
        self._read, self._write = os.pipe()
        self._thread = threading.Thread(target=self._watch, name="sidecar-stop-deadline",
                                        daemon=True)

    def start(self) -> None:
        """The stop begins: the deadline runs from now."""
        self._thread.start()

    def signalled(self, signum: int, frame: FrameType | None = None) -> None:
        """A signal handler (signal.signal) for SIGTERM and SIGINT during the stop."""
        try:
            os.write(self._write, _SECOND_SIGNAL)
        except OSError:  # the pipe is full of earlier signals: one is enough
            pass

    def join(self, timeout: float | None = None) -> None:
        """Wait for the watchdog to have acted (tests)."""
        self._thread.join(timeout)

    def _watch(self) -> None:
        started = self._clock()
        end = started + self._deadline_s
        reason = ""
        while not reason:
            left = end - self._clock()
            if left <= 0:
                reason = f"did not finish within {self._deadline_s:g}s"
                break
            readable, _, _ = select.select([self._read], [], [], left)
            if readable and os.read(self._read, 1) == _SECOND_SIGNAL:
                reason = "was signalled again"
        # The record is worth a moment, not the exit: a log stream that blocks
        # (a full stderr pipe) must not hold the process either.
        backstop = threading.Timer(_RECORD_GRACE_S, self._end, (STOP_CUT_SHORT_STATUS,))
        backstop.daemon = True
        backstop.start()
        try:
            where = self._where()
            log.error("the stop %s: ending the process now, status %d, while still "
                      "waiting for %s", reason, STOP_CUT_SHORT_STATUS, where,
                      extra={"event": "stop_cut_short", "reason": reason, "step": where,
                             "waited_s": round(self._clock() - started, 3)})
            for handler in logging.getLogger().handlers:
                handler.flush()
        finally:
            backstop.cancel()
            self._end(STOP_CUT_SHORT_STATUS)
