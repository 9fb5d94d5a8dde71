"""What the kernel is told a sidecar thread is called."""

from __future__ import annotations

import threading
from pathlib import Path

from sidecar.telemetry.thread_names import name_this_thread, os_name


def test_the_kernel_gets_the_name_without_its_prefix_cut_to_15_bytes() -> None:
    assert os_name("sidecar-origin-12") == "origin-12"
    assert os_name("sidecar-io_3") == "io_3"
    assert os_name("a-name-longer-than-the-kernel-keeps") == "a-name-longer-t"
    # A character the cut would split is left out whole.
    assert os_name("sidecar-" + "x" * 14 + "é") == "x" * 14


def test_a_thread_names_itself_for_the_kernel() -> None:
    seen: list[str] = []

    def run() -> None:
        name_this_thread()
        seen.append(Path(f"/proc/self/task/{threading.get_native_id()}/comm").read_text())

    thread = threading.Thread(target=run, name="sidecar-scrub")
    thread.start()
    thread.join(timeout=10)
    assert seen == ["scrub\n"]
