"""500 concurrent keep-alive clients replaying ranges for ~15 s (bench/load.py).

Every request is answered with the right bytes or the documented 503 SlowDown;
the sidecar's memory stays bounded and it holds no connection fds once the
clients have left. `python -m bench.load --seconds 60` is the long version.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.load import run_load
from sidecar.tools.local_s3 import LocalS3

ARTIFACT = Path("test-artifacts/reliability/load-15s.json")


def test_500_connections_for_15_seconds(local_s3: LocalS3, tmp_path: Path) -> None:
    summary = run_load(local_s3.endpoint, tmp_path, connections=500, seconds=15)
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(summary, indent=2) + "\n")
    assert summary["other_failures"] == 0, summary["failures"]
    assert summary["ok"] > 1000
    assert summary["requests"] == summary["ok"] + summary["slow_down"]
    # Bounded: buffers are per request and bounded by max_requests/max_buffered,
    # far below this; a leak per request (tens of thousands here) would not be.
    assert summary["sidecar_rss_mib"]["peak"] < summary["sidecar_rss_mib"]["before"] + 300
    assert summary["sidecar_fds"]["after"] <= summary["sidecar_fds"]["before"] + 2
    assert summary["sidecar_alive"]
