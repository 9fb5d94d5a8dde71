"""The accuracy benchmark's grid (bench/capacity_grid.py): its workloads, how a cell is judged."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.capacity_accuracy import Measured, _measured, _predicted, render
from bench.capacity_grid import (
    BLOCK,
    SLOT,
    cache_bytes,
    judged,
    readers,
    working_set_blocks,
    worst,
)
from sidecar.tools.kafka_segments import generate_topic_segments


@pytest.fixture(scope="module")
def segments():  # type: ignore[no-untyped-def]
    return list(generate_topic_segments(topic="g", partitions=3, segments_per_partition=2,
                                        segment_bytes=256 * 1024, value_size=1024, seed=3))


def test_each_pattern_reads_every_partition_and_starts_its_groups_in_turn(segments) -> None:  # type: ignore[no-untyped-def]
    one = readers("one-group", segments)
    assert len(one) == 3 and {r.after for r in one} == {None}
    # Each consumer reads its partition's segments front to back, whole.
    for reader in one:
        keys = list(dict.fromkeys(key for key, _, _ in reader.fetches))
        assert len(keys) == 2 and reader.fetches[0][1] == 0
    groups = readers("groups", segments)
    assert [(r.group, r.after, r.at) for r in groups[3:]] == [("b", "a", 0.5)] * 3
    assert groups[3].fetches == groups[0].fetches
    lagging = readers("lagging", segments)
    assert len(lagging) == 4 and (lagging[-1].after, lagging[-1].at) == ("a", 0.75)
    with pytest.raises(ValueError, match="unknown pattern"):
        readers("nobody", segments)


def test_sizes_are_shares_of_the_working_set_in_slots(segments) -> None:  # type: ignore[no-untyped-def]
    blocks = working_set_blocks(segments)
    assert blocks == sum(-(-len(s.data) // BLOCK) for s in segments)
    assert cache_bytes(0.5, 100) == 50 * SLOT and cache_bytes(0.01, 100) == 8 * SLOT


def test_a_cell_is_within_when_both_errors_are() -> None:
    row = {"measured_byte_hit_ratio": 0.90, "predicted_byte_hit_ratio": 0.915,
           "measured_origin_per_served": 1.0, "predicted_origin_per_served": 1.08}
    good = judged(row)
    assert good["within"] and good["hit_error"] == pytest.approx(0.015)
    bad = judged({**row, "predicted_origin_per_served": 1.2})
    assert not bad["within"] and bad["origin_error"] == pytest.approx(0.2)
    assert worst([good, bad]) is bad and worst([]) is None


def test_a_cell_measured_in_rounds_is_judged_on_their_mean_and_shows_their_spread(
        tmp_path: Path) -> None:
    runs = [Measured(1, tmp_path, served_cache=cache, served_origin=100 - cache,
                     origin_bytes=origin)
            for cache, origin in ((90, 110), (80, 120), (85, 100))]
    figures = _measured(runs)
    assert figures["measured_byte_hit_ratio"] == pytest.approx(0.85)
    assert figures["measured_hit_spread"] == pytest.approx(0.10)
    assert figures["measured_origin_per_served"] == pytest.approx(1.10)
    assert figures["measured_origin_spread"] == pytest.approx(0.20)


def test_the_curves_of_every_round_s_log_are_shown_as_their_mean_and_spread() -> None:
    figures = _predicted([0.80, 0.86, 0.83])
    assert figures["predicted_byte_hit_ratio_rounds"] == pytest.approx(0.83)
    assert figures["predicted_hit_spread"] == pytest.approx(0.06)
    row = judged({"streams": 16, "pattern": "lagging", "share": 0.1, "cache_blocks": 29,
                  "working_set_blocks": 290, "measured_byte_hit_ratio": 0.85,
                  "measured_hit_spread": 0.04, "measured_origin_per_served": 1.0,
                  "predicted_byte_hit_ratio": 0.80, "predicted_origin_per_served": 1.02,
                  "predicted_read_ahead_wasted_per_served": 0.0, **figures,
                  "hit_error_rounds": figures["predicted_byte_hit_ratio_rounds"] - 0.85})
    page = render({"command": "python -m bench.capacity_accuracy", "date": "2026-11-27 22:00",
                   "seconds": 1.0, "machine": {}, "full_grid": True, "rounds": 3,
                   "reference_share": 0.25, "rows": [row], "worst": row})
    # The first log's curve is 5 points off (out); the mean of the three, 2 (within).
    assert "**0 of 1 cells within.**" in page and "within 2 points on 1 of 1 cells" in page
    assert "| -5.0 | 0.830 (6.0) | -2.0 |" in page
