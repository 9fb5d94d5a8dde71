"""A benchmark stopped by SIGTERM or SIGHUP unwinds as at Ctrl-C.

Python ends a process at SIGTERM without running its `finally` blocks or the
exits of its `with` blocks, so a sidecar, moto or a Spark job a benchmark
started would outlive it. Raised as KeyboardInterrupt instead, the signal
unwinds the stack, and every server is stopped by the block that started it.
"""

from __future__ import annotations

import signal


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def unwind_on_signals() -> None:
    """From now on, SIGTERM and SIGHUP unwind the main thread as Ctrl-C does."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
