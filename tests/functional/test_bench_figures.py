"""What bench/cpu.py reads of a server: real process trees, /proc read as the
benchmark reads it around a replay."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench import cpu
from tests.support.waiting import eventually

# A parent that starts a child, waits for it to end (so the kernel adds the
# child's figures to the parent's), says so in a file, then only sleeps.
_PARENT = """
import subprocess, sys, time
subprocess.run([sys.executable, "-c", sys.argv[1]], check=True)
open(sys.argv[2], "w").close()
time.sleep(60)
"""
# A child that spins until it has used 0.5 s of CPU itself.
_SPINNER = """
import time
while time.process_time() < 0.5:
    sum(range(10_000))
"""
# A parent that starts a child and only waits; the child holds 96 MiB of
# touched memory, says so in a file, then sleeps.
_HOLDING_PARENT = """
import subprocess, sys
subprocess.run([sys.executable, "-c", sys.argv[1], sys.argv[2]])
"""
_HOLDER = """
import sys, time
held = bytearray(96 * 1024 * 1024)
for at in range(0, len(held), 4096):
    held[at] = 1
open(sys.argv[1], "w").close()
time.sleep(60)
"""
MiB = 1024 * 1024


@contextmanager
def _tree(parent: str, child: str, marker: Path) -> Iterator[int]:
    """`parent` running with `child`'s code, until `marker` exists: its pid."""
    process = subprocess.Popen([sys.executable, "-c", parent, child, str(marker)],
                               start_new_session=True)
    try:
        eventually(lambda: marker.exists() or None, "the process tree's marker", timeout=60)
        yield process.pid
    finally:
        os.killpg(process.pid, 9)
        process.wait(timeout=10)


def test_the_cpu_of_a_child_that_ended_meanwhile_is_counted(tmp_path: Path) -> None:
    """A child that ends during the window (nginx's cache loader does, a minute
    after the start) took CPU of the server's: it is not lost when it is
    waited for, and the server's figure never goes back."""
    marker = tmp_path / "child-ended"
    with _tree(_PARENT, _SPINNER, marker) as pid:
        used = cpu.usage(pid)
    assert used.user_s + used.system_s >= 0.5


def test_the_peak_rss_of_a_server_counts_its_children(tmp_path: Path) -> None:
    """nginx's master holds a few MiB; its workers hold the rest."""
    marker = tmp_path / "memory-held"
    with _tree(_HOLDING_PARENT, _HOLDER, marker) as pid:
        peak = cpu.peak_rss_bytes(pid)
    assert peak is not None and peak >= 96 * MiB
