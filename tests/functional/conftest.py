"""Real servers on loopback: moto's S3 server, a recording proxy, the sidecar."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.local_s3 import CREDENTIALS, LocalS3, loopback_client
from tests.support.fault_proxy import FaultProxy
from tests.support.installs import ensure
from tests.support.processes import SidecarProcess
from tests.support.recording_proxy import RecordingProxy
from tests.support.s3_clients import close_clients
from tests.support.spark_cluster import StandaloneCluster, executor_python
from tests.support.verifying_proxy import VerifyingProxy

BLOCK = 64 * 1024  # small blocks: many block boundaries with little data


@pytest.fixture(scope="session", autouse=True)
def _credentials() -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="session")
def local_s3(_credentials: None) -> Iterator[LocalS3]:
    with LocalS3() as server:
        yield server


@pytest.fixture(scope="session")
def prometheus_installed() -> None:
    ensure("ensure-prometheus.sh")


@pytest.fixture(scope="session")
def chromium_installed() -> None:
    ensure("ensure-chromium.sh")


@pytest.fixture(scope="session")
def spark_standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    """One Spark standalone master and worker for every job the suite submits to
    a cluster (a start takes some ten seconds); the executors see the origin's
    credentials. Each job is an application of its own."""
    with StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"),
                           env=CREDENTIALS) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def executor_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter for executors: this venv's libraries, not the project."""
    return executor_python(tmp_path_factory.mktemp("executor"))


@pytest.fixture(scope="session")
def proxy(local_s3: LocalS3) -> Iterator[RecordingProxy]:
    with RecordingProxy(local_s3.endpoint) as recording:
        yield recording


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    close_clients()


@pytest.fixture(scope="module")
def verifying(local_s3: LocalS3) -> Iterator[VerifyingProxy]:
    """A proxy in front of moto that checks the sidecar's re-signed requests
    (moto itself does not verify signatures); one per test module."""
    with VerifyingProxy(local_s3.endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def fault_proxy(local_s3: LocalS3) -> Iterator[FaultProxy]:
    """A misbehaving origin in front of moto that each test scripts (and heals);
    one per test module."""
    with FaultProxy(local_s3.endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="session")
def origin_s3(local_s3: LocalS3) -> Iterator[Any]:
    client = loopback_client(local_s3.endpoint)
    yield client
    client.close()


@pytest.fixture()
def bucket(origin_s3: Any) -> str:
    name = "t-" + secrets.token_hex(6)
    origin_s3.create_bucket(Bucket=name)
    return name


@pytest.fixture()
def sidecar(proxy: RecordingProxy, tmp_path: Path) -> Iterator[SidecarProcess]:
    """A sidecar with 64 KiB blocks and room for 48 of them, behind the recording proxy.

    Read-ahead is off: these tests pin down exactly which foreground reads reach
    the origin. `prefetching_sidecar` has it on.
    """
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(
        proxy.endpoint, cache, "--block-size", "64KiB", "--cache-size", str(48 * (BLOCK + 4096)),
        env={"SIDECAR_PREFETCH": "false"},
    ) as process:
        proxy.clear()
        yield process


PREFETCH_BLOCK = 1024 * 1024


@pytest.fixture()
def prefetching_sidecar(proxy: RecordingProxy, tmp_path: Path) -> Iterator[SidecarProcess]:
    """1 MiB blocks (to 128 KiB fetches, the broker's 1 MiB fetch to 8 MiB blocks),
    room for 64, read-ahead up to 8 blocks, behind the recording proxy."""
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(
        proxy.endpoint, cache, "--block-size", "1MiB",
        "--cache-size", str(64 * (PREFETCH_BLOCK + 4096)),
        env={"SIDECAR_PREFETCH_MAX_WINDOW": "8MiB"},
    ) as process:
        proxy.clear()
        yield process
