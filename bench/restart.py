"""restart: how soon the store serves after a kill -9, over 100k slots, 3 times.

Each start is bench/recovery.py in a child process (a fresh interpreter, as
at a real start, from a cold page cache); the median of the three is judged.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from bench.harness import REPO, Bench

SCENARIO = "restart"
RESTART_SLOTS = 100_000
STARTS = 3


def run_restart(bench: Bench) -> None:
    bench.scenarios[SCENARIO] = {"slots": RESTART_SLOTS, "runs": {}}
    print(f"{SCENARIO}: start over {RESTART_SLOTS:,} slots from a cold page cache, 3 times",
          file=sys.stderr, flush=True)
    bench.attempt(SCENARIO, "index", _index)


def _index() -> dict[str, Any]:
    runs = []
    for attempt in range(STARTS):
        # A child process each time: a fresh interpreter, as at a real start.
        done = subprocess.run(
            [sys.executable, "-m", "bench.recovery", "--slots", str(RESTART_SLOTS),
             "--seed", str(attempt + 1)],
            cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
        )
        runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    seconds = sorted(run["seconds"] for run in runs)
    scanned = sorted(run["scan_seconds"] for run in runs)
    print(f"  ready in {seconds} s, headers scanned in {scanned} s", file=sys.stderr,
          flush=True)
    return {"seconds": seconds, "median_seconds": seconds[1],
            "scan_seconds": scanned, "median_scan_seconds": scanned[1],
            "recovered": [run["recovered"] for run in runs],
            "ok": all(run["ok"] for run in runs)}
