"""The access log on a disk that really fills up (a small tmpfs) under the
sidecar as a real process: lines that do not fit are dropped and counted, and
once there is room again every line of the file is whole JSON."""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.tools.local_s3 import LocalS3
from tests.support.loopback_http import raw_request
from tests.support.processes import SidecarProcess
from tests.support.tmpfs import mounted_tmpfs
from tests.support.waiting import eventually


@pytest.fixture()
def log_disk(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs for the access log alone."""
    with mounted_tmpfs(tmp_path / "logs", "1m") as mount:
        yield mount


def fill(path: Path) -> None:
    """Write `path` until the file system has no byte left."""
    with open(path, "wb", buffering=0) as filler:
        try:
            while True:
                filler.write(b"\0" * 4096)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


@pytest.mark.parametrize("copytruncate", [False, True])
def test_a_full_log_disk_leaves_no_torn_line_behind(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path, log_disk: Path,
    copytruncate: bool,
) -> None:
    """`copytruncate`: a log rotator empties the file under the sidecar first
    (logrotate's copytruncate), so the file is shorter than the sidecar wrote."""
    origin_s3.put_object(Bucket=bucket, Key="seg.log", Body=b"x" * 1000)
    access_log = log_disk / "access.jsonl"
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(local_s3.endpoint, cache, "--access-log", str(access_log)) as sidecar:

        def read() -> None:
            assert raw_request(sidecar.data_url, "GET", f"/{bucket}/seg.log",
                               {"Range": "bytes=0-9"})[0] == 206

        def dropped() -> float:
            return sidecar.metric("sidecar_access_log_dropped_lines_total", reason="disk")

        read()
        eventually(lambda: access_log.stat().st_size > 0, "the first line")
        sent = 1
        if copytruncate:
            read()
            eventually(lambda: len(access_log.read_bytes().splitlines()) == 2, "two lines")
            os.truncate(access_log, 0)
            sent = 0
        fill(log_disk / "filler")
        # The log's last page has room for a few lines; the read whose line
        # crosses into the next page finds the disk full part way through it.
        while not dropped():
            size = access_log.stat().st_size
            read()
            sent += 1
            eventually(lambda: access_log.stat().st_size > size or dropped(),  # noqa: B023
                       f"line {sent} written or dropped")
            assert sent < 100, "the log disk never filled"
        (log_disk / "filler").unlink()
        for _ in range(3):
            read()
        sent += 3
        lost = dropped()
        sidecar.stop()
    lines = access_log.read_bytes().split(b"\n")
    assert lines[-1] == b"", "the file ends inside a line"
    logged = [json.loads(line) for line in lines[:-1]]
    assert all(entry["status"] == 206 for entry in logged)
    assert len(logged) == sent - lost and lost >= 1
