"""What a broker node gets from `pip install .`: the serving path, and only that.

The package is built as the image builds it (pyproject.toml, README.md and
sidecar/ copied, nothing else) into a fresh virtual environment, which then
serves: /healthz answers and /ui (a package resource) is there. The tools and
Spark stay out.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.support.processes import SidecarProcess

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.functional


def test_pip_install_dot_serves_without_tools_or_spark(tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):  # what the Dockerfile copies
        shutil.copy(ROOT / name, source / name)
    shutil.copytree(ROOT / "sidecar", source / "sidecar",
                    ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         str(source)], capture_output=True, text=True, check=False, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    listing = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"],
                             capture_output=True, text=True, check=True).stdout.lower()
    packages = {line.split("==")[0] for line in listing.splitlines()}
    assert "kafka-cold-sidecar" in packages and "aiobotocore" in packages
    assert not packages & {"moto", "boto3", "kafka-python", "pyspark", "flask", "crc32c"}

    help_text = subprocess.run([str(venv / "bin" / "sidecar"), "serve", "--help"],
                               capture_output=True, text=True, check=True).stdout
    assert "--cache-dir" in help_text
    cache = tmp_path / "cache"
    cache.mkdir()
    # No origin runs here: the start-up check is off, and nothing is read.
    with SidecarProcess("http://127.0.0.1:9", cache, "--cache-size", "64MiB",
                        env={"SIDECAR_ORIGIN_CHECK": "false"},
                        program=(str(venv / "bin" / "sidecar"),)) as sidecar:
        with urllib.request.urlopen(sidecar.admin_url + "/healthz", timeout=10) as answer:
            assert answer.status == 200
        with urllib.request.urlopen(sidecar.admin_url + "/ui", timeout=10) as answer:
            assert b"<canvas" in answer.read()
