"""A corner of the capacity accuracy grid (bench/capacity_accuracy.py) in the suite.

A consumer reads a partition while a lagging one catches up on it from the
start, at once, served by real sidecars in front of moto with the cache at a
quarter and at half of the working set; the curve replayed from the quarter
run's access log predicts both within the target (2 points of byte hit ratio,
10% of origin bytes per served byte), as the sidecars' own counters measured
them. (Cells with more streams move by a point of byte hit ratio from one run
to the next, and some by several, where a second group may or may not catch up
with the first: bench/ANALYSIS.md; the suite holds the target where one run
can show it.) And a grid stopped by SIGTERM stops the servers it started.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from bench.capacity_accuracy import run_cell
from bench.capacity_grid import HIT_POINTS, ORIGIN_SHARE, REFERENCE_SHARE
from tests.support.processes import kill_group
from tests.support.waiting import eventually

STREAMS, PATTERN, OTHER_SHARE = 1, "lagging", 0.5
ROOT = Path(__file__).resolve().parents[2]


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



def _serving(process: psutil.Process) -> bool:
    return any(c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp"))


@pytest.mark.parametrize("when", ["starting", "serving"])
def test_a_grid_stopped_by_sigterm_stops_the_servers_it_started(tmp_path: Path,
                                                                when: str) -> None:
    """SIGTERM ended the grid at once, and the sidecar it was measuring lived on;
    one interrupted as it started was left by the `with` that never began."""
    grid = subprocess.Popen(
        [sys.executable, "-m", "bench.capacity_accuracy", "--streams", "1", "--patterns",
         "one-group", "--shares", "0.25", "--rounds", "3", "--out", str(tmp_path)],
        cwd=Path(__file__).resolve().parents[2], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        parent = psutil.Process(grid.pid)

        def sidecar_up() -> list[psutil.Process] | None:
            children = parent.children(recursive=True)
            try:
                sidecars = [child for child in children if "serve" in child.cmdline()]
                up = sidecars and (when == "starting" or _serving(sidecars[0]))
            except psutil.Error:  # one came and went meanwhile
                return None
            return children if up else None

        servers = eventually(sidecar_up, f"the grid's first sidecar {when}", timeout=60)
        grid.send_signal(signal.SIGTERM)
        assert grid.wait(timeout=60) != 0
        # Gone by the time the grid is (an orphan may die later, of a closed pipe).
        assert [server.pid for server in servers if server.is_running()] == []
    finally:
        kill_group(grid)


def test_a_former_run_s_kept_logs_are_judged_again_without_serving(tmp_path: Path) -> None:
    """`--again DIR` replays the access logs a run kept and prints the same
    table: the measured figures read back from the logs are the sidecars'
    counters, and the same replay predicts the same."""
    command = [sys.executable, "-m", "bench.capacity_accuracy", "--streams", "1",
               "--patterns", "groups", "--shares", "0.1,0.5", "--rounds", "1"]
    run = subprocess.run([*command, "--out", str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    kept = re.search(r"access logs are kept in (\S+) ", run.stderr)
    assert kept, run.stderr[-2000:]
    again = subprocess.run([*command, "--again", kept[1]], capture_output=True, text=True,
                           timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    first = json.loads((tmp_path / "out" / "capacity-accuracy.json").read_text())
    rows = [line for line in again.stdout.splitlines() if line.startswith("| 1 | groups |")]
    assert len(rows) == len(first["rows"]) == 2
    for line, row in zip(rows, first["rows"], strict=True):
        cells = [cell.strip() for cell in line.split("|")[1:-1]]
        assert float(cells[3]) == pytest.approx(row["measured_byte_hit_ratio"], abs=5e-4)
        assert float(cells[5]) == pytest.approx(row["predicted_byte_hit_ratio"], abs=5e-4)
        assert float(cells[9]) == pytest.approx(row["measured_origin_per_served"], abs=5e-4)
    assert "read again from the access logs" in again.stdout
    missing = subprocess.run([*command, "--again", str(tmp_path / "nothing")],
                             capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert missing.returncode == 2
    assert f"--again {tmp_path / 'nothing'}: no such directory" in missing.stderr
    empty = subprocess.run([*command, "--again", str(tmp_path)], capture_output=True,
                           text=True, timeout=60, cwd=ROOT)
    assert empty.returncode == 2 and "no cell's access logs under it" in empty.stderr
