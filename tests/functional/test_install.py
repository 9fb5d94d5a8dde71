"""What a broker node gets: the wheel of `make dist`, and in it the serving path only.

`make dist` builds the wheel and the sdist; the wheel is installed into a fresh
virtual environment, which then serves: `sidecar --version` names the version,
/healthz answers and /ui (a package resource) is there. The tools and Spark stay
out. The image's build stage, given only the files the Dockerfile copies, builds
the same wheel: the same package files, entry point and dependencies.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
import tarfile
import tomllib
import urllib.request
import zipfile
from pathlib import Path

import pytest

from tests.support.deploy_files import context_sources, dockerfile_stages, wheel_name
from tests.support.processes import SidecarProcess

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
pytestmark = pytest.mark.functional


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What `make dist` builds, in a directory of the test's own (DIST=)."""
    out = tmp_path_factory.mktemp("dist")
    built = subprocess.run(["make", "dist", f"DIST={out}"], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    return out


def test_make_dist_builds_the_wheel_and_the_sdist(dist: Path) -> None:
    sdist_name = f"kafka_cold_sidecar-{VERSION}.tar.gz"
    assert sorted(path.name for path in dist.iterdir()) == sorted([wheel_name(), sdist_name])
    with zipfile.ZipFile(dist / wheel_name()) as wheel:
        names = set(wheel.namelist())
    assert {"sidecar/cli.py", "sidecar/admin/ui.html", "sidecar/py.typed"} <= names
    assert not any(name.startswith(("tests/", "bench/")) for name in names)
    with tarfile.open(dist / sdist_name) as sdist:
        top = {Path(name).parts[1] for name in sdist.getnames() if len(Path(name).parts) > 1}
    assert {"pyproject.toml", "README.md", "sidecar"} <= top
    assert not top & {"tests", "bench", ".venv"}


def test_the_wheel_installs_and_serves_without_tools_or_spark(dist: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check",
         str(dist / wheel_name())], capture_output=True, text=True, check=False, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-2000:]
    listing = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"],
                             capture_output=True, text=True, check=True).stdout.lower()
    packages = {line.split("==")[0] for line in listing.splitlines()}
    assert "kafka-cold-sidecar" in packages and "aiobotocore" in packages
    assert not packages & {"moto", "boto3", "kafka-python", "pyspark", "flask", "crc32c"}

    version = subprocess.run([str(venv / "bin" / "sidecar"), "--version"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    assert version.split()[:2] == ["sidecar", VERSION], version
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


def wheel_contents(path: Path) -> tuple[set[str], str, list[str]]:
    """The package files (not the metadata), the entry points and Requires-Dist of a wheel."""
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        info = next(name.split("/")[0] for name in names if name.endswith(".dist-info/METADATA"))
        entry_points = wheel.read(f"{info}/entry_points.txt").decode()
        requires = [line for line in wheel.read(f"{info}/METADATA").decode().splitlines()
                    if line.startswith("Requires-Dist:")]
    return {name for name in names if not name.startswith(info)}, entry_points, requires


def test_the_image_build_stage_makes_the_same_wheel(dist: Path, tmp_path: Path) -> None:
    """What the Dockerfile copies is all `sidecar serve` needs: its build stage's own
    command, run on a directory holding only those files, makes the wheel of `make dist`
    (less the warm-up job, which the image does not carry)."""
    context = tmp_path / "context"
    context.mkdir()
    for source in context_sources():
        if (ROOT / source).is_dir():
            shutil.copytree(ROOT / source, context / source,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / source, context / source)
    (build_command,) = [run for run in dockerfile_stages()[0]["RUN"] if "pip wheel" in run]
    words = shlex.split(build_command)
    image_wheels = words[words.index("--wheel-dir") + 1]
    out = tmp_path / "wheels"
    words = [str(out) if word == image_wheels else word for word in words]
    assert words[0] == "pip"
    built = subprocess.run([sys.executable, "-m", *words], cwd=context, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]

    files, entry_points, requires = wheel_contents(out / wheel_name())
    dist_files, dist_entry_points, dist_requires = wheel_contents(dist / wheel_name())
    assert files == {name for name in dist_files if not name.startswith("spark_warmup/")}
    assert entry_points == dist_entry_points and "sidecar = sidecar.cli:main" in entry_points
    assert requires == dist_requires
