"""The sidecar's threads carry their kind in the kernel's thread names, as
`top -H` and `ps -L` show them, and its metrics split its CPU by them."""

from __future__ import annotations

import random
import secrets
from pathlib import Path
from typing import Any

from sidecar.tools.local_s3 import LocalS3
from tests.support.processes import SidecarProcess
from tests.support.s3_clients import s3_client
from tests.support.waiting import eventually

MiB = 1024 * 1024


def thread_names(pid: int) -> list[str]:
    names = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.append((task / "comm").read_text().strip())
        except OSError:
            continue  # ended meanwhile
    return names


def test_origin_disk_and_access_log_threads_are_named_for_the_kernel(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    key = f"names-{secrets.token_hex(4)}.log"
    data = random.Random(7).randbytes(3 * MiB)
    origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
    (tmp_path / "cache").mkdir()
    with SidecarProcess(local_s3.endpoint, tmp_path / "cache", "--block-size", "1MiB",
                        "--access-log", str(tmp_path / "access.log")) as sidecar:
        # A miss starts the disk threads; the origin threads and the access
        # log's are there from the start.
        assert s3_client(sidecar.data_url).get_object(Bucket=bucket, Key=key)["Body"].read() \
            == data
        names = eventually(
            lambda: (lambda found: found if any(n.startswith("io_") for n in found) else None)(
                thread_names(sidecar.pid)),
            "a disk thread named for the kernel")
        # The metric splits the process's CPU by those names.
        spent = {kind: sidecar.metric("sidecar_thread_cpu_seconds_total", thread=kind)
                 for kind in ("event-loop", "origin", "io")}
    assert any(name.startswith("origin-") for name in names), names
    assert "access-log" in names, names
    assert not any(name.startswith("sidecar-") for name in names), names
    assert all(seconds > 0 for seconds in spent.values()), spent
