"""A corner of the capacity accuracy grid (bench/capacity_accuracy.py) in the suite.

Four consumers read four partitions at once while a lagging one catches up,
served by real sidecars in front of moto with the cache at a quarter and at
half of the working set; the curve replayed from the quarter run's access log
predicts both within the target (2 points of byte hit ratio, 10% of origin
bytes per served byte), as the sidecars' own counters measured them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.capacity_accuracy import run_cell
from bench.capacity_grid import HIT_POINTS, ORIGIN_SHARE, REFERENCE_SHARE

STREAMS, PATTERN, OTHER_SHARE = 4, "lagging", 0.5


def test_the_curve_of_one_size_predicts_another_with_readers_at_once(
    local_s3: Any, origin_s3: Any, bucket: str, tmp_path: Path,
) -> None:
    rows = run_cell(local_s3.endpoint, origin_s3, STREAMS, PATTERN,
                    (REFERENCE_SHARE, OTHER_SHARE), tmp_path, bucket)
    assert [row["share"] for row in rows] == [REFERENCE_SHARE, OTHER_SHARE]
    for row in rows:
        assert abs(row["hit_error"]) <= HIT_POINTS, row
        assert abs(row["origin_error"]) <= ORIGIN_SHARE, row
    # Readers did read at once and the sizes differ enough for a curve to mean
    # something: the smaller cache reads more from the origin per byte served.
    assert rows[0]["measured_origin_per_served"] > rows[1]["measured_origin_per_served"]
