"""The origin's worker threads take the most urgent work first."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sidecar.origin.workers import OriginWorkers, Urgency


def test_queued_work_runs_most_urgent_first_then_in_arrival_order() -> None:
    workers = OriginWorkers(1)
    release, started = threading.Event(), threading.Event()
    ran: list[str] = []

    def hold() -> None:
        started.set()
        release.wait(timeout=10)

    try:
        busy = workers.submit(Urgency.WARM, hold)  # holds the only thread
        assert started.wait(timeout=5)
        futures = [workers.submit(urgency, lambda name=name: ran.append(name))
                   for urgency, name in [(Urgency.PREFETCH, "prefetch-1"),
                                         (Urgency.WARM, "warm"),
                                         (Urgency.FOREGROUND, "foreground"),
                                         (Urgency.PREFETCH, "prefetch-2"),
                                         (Urgency.WAITED_FOR, "waited-for")]]
        assert workers.queued == 5
        release.set()
        busy.result(timeout=5)
        for future in futures:
            future.result(timeout=5)
        assert ran == ["waited-for", "foreground", "prefetch-1", "prefetch-2", "warm"]
    finally:
        release.set()
        workers.shutdown()


def test_results_and_errors_reach_the_future() -> None:
    workers = OriginWorkers(2)
    try:
        assert workers.submit(Urgency.FOREGROUND, lambda: 42).result(timeout=5) == 42
        with pytest.raises(ZeroDivisionError):
            workers.submit(Urgency.PREFETCH, lambda: 1 // 0).result(timeout=5)
    finally:
        workers.shutdown()


def test_shutdown_cancels_what_has_not_started() -> None:
    workers = OriginWorkers(1)
    release, started = threading.Event(), threading.Event()

    def hold() -> bool:
        started.set()
        return release.wait(timeout=10)

    running = workers.submit(Urgency.FOREGROUND, hold)
    assert started.wait(timeout=5)  # the only thread has it: what comes next waits
    waiting = workers.submit(Urgency.FOREGROUND, lambda: None)
    # shutdown waits for the running work; let it end once shutdown has begun.
    threading.Timer(0.2, release.set).start()
    workers.shutdown()
    assert running.result(timeout=5) is True and waiting.cancelled()
    with pytest.raises(RuntimeError):
        workers.submit(Urgency.FOREGROUND, lambda: None)


def test_worker_threads_tell_the_kernel_their_names() -> None:
    workers = OriginWorkers(2)
    try:
        tid = workers.submit(Urgency.PREFETCH, threading.get_native_id).result(timeout=5)
        comm = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        assert comm in ("origin-0", "origin-1")
    finally:
        workers.shutdown()

