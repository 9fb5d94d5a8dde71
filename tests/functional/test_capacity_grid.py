"""A corner of the capacity accuracy grid (bench/capacity_accuracy.py) in the suite.

A consumer reads a partition while a lagging one catches up on it from the
start, at once, served by real sidecars in front of moto with the cache at a
quarter and at half of the working set; the curve replayed from the quarter
run's access log predicts both within the target (2 points of byte hit ratio,
10% of origin bytes per served byte), as the sidecars' own counters measured
them. (Cells with more streams move by a point of byte hit ratio from one run
to the next, and some by several, where a second group may or may not catch up
with the first: bench/ANALYSIS.md; the suite holds the target where one run
can show it.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.capacity_accuracy import run_cell
from bench.capacity_grid import HIT_POINTS, ORIGIN_SHARE, REFERENCE_SHARE

STREAMS, PATTERN, OTHER_SHARE = 1, "lagging", 0.5


def test_the_curve_of_one_size_predicts_another_with_readers_at_once(
    local_s3: Any, origin_s3: Any, bucket: str, tmp_path: Path,
) -> None:
    rows = run_cell(local_s3.endpoint, origin_s3, STREAMS, PATTERN,
                    (REFERENCE_SHARE, OTHER_SHARE), tmp_path, bucket)
    assert [row["share"] for row in rows] == [REFERENCE_SHARE, OTHER_SHARE]
    assert rows[0]["cache_blocks"] < rows[1]["cache_blocks"] < rows[0]["working_set_blocks"]
    for row in rows:
        assert abs(row["hit_error"]) <= HIT_POINTS, row
        assert abs(row["origin_error"]) <= ORIGIN_SHARE, row
