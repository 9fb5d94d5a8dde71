"""What a test needs from outside Python, installed by the project's own scripts.

Each `scripts/ensure-*.sh` installs one real component from Debian (Chromium,
Prometheus, nginx, the S3 clients, disk tools, systemd-analyze) when it is
missing; a test calls `ensure` once per session before using it. Files the tests
leave for people to look at (screenshots, reliability summaries) go under
`test-artifacts/`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts"


def ensure(script: str) -> None:
    """Run scripts/SCRIPT; fail the test with its output if it cannot install."""
    result = subprocess.run(["sh", str(ROOT / "scripts" / script)], capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, f"{script} failed:\n{result.stdout}\n{result.stderr}"


def save_artifact(name: str, data: bytes, folder: str = "ui") -> Path:
    path = ARTIFACTS / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path
