"""`sidecar replay` as a user runs it: a child process with the local S3 server's
credentials, its answer parsed from the one JSON line `--json` prints."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from sidecar.tools.local_s3 import CREDENTIALS


def run_replay(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sidecar", "replay", *args], capture_output=True, text=True,
        timeout=timeout, env={**os.environ, **CREDENTIALS, "SIDECAR_LOG_LEVEL": "WARNING"},
    )


def replay_json(*args: str, expect: int = 0) -> dict[str, Any]:
    result = run_replay(*args, "--json")
    assert result.returncode == expect, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1, result.stdout  # exactly one JSON object, for the harness
    report: dict[str, Any] = json.loads(lines[0])
    return report
