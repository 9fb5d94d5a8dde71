"""The warm-up's progress line, from the sidecars' counters (a scripted reader)."""

from __future__ import annotations

import io
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from spark_warmup.progress import WarmProgress, stats_reader, warm_blocks
from tests.support.clock import FakeClock

MIB = 1024 * 1024


class Sidecars:
    """warm_blocks counters per admin URL; a URL in `down` does not answer."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.down: set[str] = set()
        self.reads = 0

    def read(self, url: str) -> Mapping[str, Any]:
        self.reads += 1
        if url in self.down:
            raise OSError("connection refused")
        return {"warm_blocks": {"fetched": self.counts[url], "already_cached": 0, "failed": 0}}


def test_the_line_counts_from_the_start_and_leaves_out_who_does_not_answer() -> None:
    sidecars = Sidecars({"http://a": 100, "http://b": 0})  # a warmed before this run
    clock = FakeClock(50.0)
    progress = WarmProgress({"a": "http://a", "b": "http://b"}, planned_blocks=40,
                            block_size=4 * MIB, out=io.StringIO(), interval_s=10,
                            read=sidecars.read, clock=clock)
    sidecars.counts.update({"http://a": 110, "http://b": 6})
    clock.advance(4)
    assert progress.line() == "warm-up: 64.0 MiB of 160.0 MiB (40%), 16.0 MiB/s"
    sidecars.down.add("http://b")
    assert progress.line().endswith("; 1 of 2 sidecars not answering")
    sidecars.down.clear()
    sidecars.counts["http://a"] = 500  # more than planned (another warm-up): capped
    assert "160.0 MiB of 160.0 MiB (100%)" in progress.line()


def test_a_sidecar_silent_at_the_start_counts_from_its_first_answer() -> None:
    # Its counters hold every warm-up since it started: without a reading from
    # the start of this run, its first answer is where this run's count begins.
    sidecars = Sidecars({"http://a": 0, "http://b": 1000})
    sidecars.down.add("http://b")
    progress = WarmProgress({"a": "http://a", "b": "http://b"}, planned_blocks=40,
                            block_size=MIB, out=io.StringIO(), interval_s=10,
                            read=sidecars.read, clock=FakeClock(0.0))
    sidecars.down.clear()
    sidecars.counts.update({"http://a": 4, "http://b": 1002})
    assert progress.line().startswith("warm-up: 4.0 MiB of 40.0 MiB (10%)")
    sidecars.counts["http://b"] = 1010
    assert progress.line().startswith("warm-up: 12.0 MiB of 40.0 MiB (30%)")


def test_no_interval_reads_and_prints_nothing() -> None:
    sidecars, out = Sidecars({"http://a": 0}), io.StringIO()
    with WarmProgress({"a": "http://a"}, 1, MIB, out, 0, read=sidecars.read):
        sidecars.counts["http://a"] = 1
    assert sidecars.reads == 0 and out.getvalue() == ""


def test_warm_blocks_adds_every_outcome() -> None:
    assert warm_blocks({"warm_blocks": {"fetched": 2, "already_cached": 3, "failed": 1}}) == 6
    assert warm_blocks({}) == 0


def test_a_stats_reader_with_a_missing_ca_file_fails_at_reading_not_before(
        tmp_path: Path) -> None:
    # Made for every real run, whether progress lines are printed or not.
    read = stats_reader("tok", str(tmp_path / "no-ca.pem"))
    with pytest.raises(OSError):
        read("https://127.0.0.1:1")
