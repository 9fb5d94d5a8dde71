"""A stop that a hung cache disk cannot hold: past `stop_timeout`, or at a
second SIGTERM, the sidecar says what it was still waiting for and exits 1.

The cache disk is an ext4 file system on a loop device, frozen with fsfreeze(8)
once the sidecar serves: the stop's index snapshot then waits in the kernel in
D state (its file cannot even be created), as on an NFS or EBS volume gone away.
The disk is thawed only after the sidecar has logged its exit, so a stop that
waits for the disk fails these tests within their bounds instead of hanging
them. A process with a thread in D state is reaped only once that thread leaves
the kernel, which is why its status is read after the thaw.

A request still being answered does not hold the stop either: it gets half the
bound to finish, and is then cut off, logged and counted, within the bound.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sidecar.cache.slot_format import SLOT_HEADER_SIZE
from sidecar.tools.local_s3 import LocalS3
from tests.support.loop_disk import LoopDisk, ensure_disk_tools, frozen, loop_disk
from tests.support.loopback_http import raw_request
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

MiB = 1024 * 1024
# Well under the 20 s default: that a record comes sooner than that shows which
# of the two ended the stop.
RECORD_WAIT_S = 10.0


@pytest.fixture(scope="module", autouse=True)
def disk_tools() -> None:
    ensure_disk_tools()


@pytest.fixture
def cache_disk(tmp_path: Path) -> Iterator[LoopDisk]:
    with loop_disk(tmp_path, 32 * MiB) as disk:
        yield disk


def start(local_s3: LocalS3, cache_dir: Path, **env: str) -> SidecarProcess:
    return SidecarProcess(
        local_s3.endpoint, cache_dir, "--block-size", "1MiB",
        "--cache-size", str(8 * (MiB + SLOT_HEADER_SIZE)),
        env={"SIDECAR_PREFETCH": "false", "SIDECAR_SCRUB_RATE": "0",
             "SIDECAR_LOG_FORMAT": "json", "SIDECAR_DISK_CHECK_INTERVAL": "30s", **env},
    )


def cached_object(sidecar: SidecarProcess, origin_s3: Any, bucket: str) -> tuple[str, bytes]:
    key = f"stop-{secrets.token_hex(4)}.log"
    data = random.Random(key).randbytes(3 * MiB)
    origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
    eventually(lambda: sidecar.metric("sidecar_cache_blocks") >= 3, "the blocks cached")
    sidecar.wait_idle()
    return key, data


def cut_short(sidecar: SidecarProcess) -> dict[str, Any] | None:
    for line in list(sidecar.stderr_lines):
        record = json.loads(line)
        if record.get("event") == "stop_cut_short":
            return record  # type: ignore[no-any-return]
    return None


def waits_on_the_frozen_disk(pid: int) -> bool:
    """A thread of `pid` sleeps uninterruptibly (D) on the file system's freeze
    lock (a per-CPU rw-semaphore since Linux 4.x): a write to the frozen disk."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        stat = (task / "stat").read_text()
        if stat[stat.rindex(")") + 2] == "D" and "rwsem" in (task / "wchan").read_text():
            return True
    return False


def test_a_stop_held_by_a_hung_cache_disk_ends_at_the_deadline_and_says_why(
    local_s3: LocalS3, origin_s3: Any, bucket: str, cache_disk: LoopDisk
) -> None:
    sidecar = start(local_s3, cache_disk.mount, SIDECAR_STOP_TIMEOUT="1s").launch()
    try:
        sidecar.await_ready()
        key, data = cached_object(sidecar, origin_s3, bucket)
        with frozen(cache_disk.mount):
            sidecar.terminate()
            record = eventually(lambda: cut_short(sidecar), "the stop cut short",
                                RECORD_WAIT_S)
        assert record["level"] == "ERROR"
        assert record["reason"] == "did not finish within 1s"
        assert record["step"] == ("the cache to close: the index snapshot to be written "
                                  "to the cache disk")
        assert 1.0 <= record["waited_s"] < RECORD_WAIT_S
    finally:
        status = sidecar.stop()
    assert status == 1
    # Nothing was lost but the snapshot: the next start scans and serves the same bytes.
    with start(local_s3, cache_disk.mount) as again:
        assert raw_request(again.data_url, "GET", f"/{bucket}/{key}")[2] == data
    assert again.stop() == 0


def test_a_second_sigterm_during_a_held_stop_ends_the_process_at_once(
    local_s3: LocalS3, origin_s3: Any, bucket: str, cache_disk: LoopDisk
) -> None:
    sidecar = start(local_s3, cache_disk.mount).launch()  # the default deadline, 20 s
    try:
        sidecar.await_ready()
        cached_object(sidecar, origin_s3, bucket)
        with frozen(cache_disk.mount):
            sidecar.terminate()
            eventually(lambda: waits_on_the_frozen_disk(sidecar.pid),
                       "the stop waiting on the frozen disk", RECORD_WAIT_S)
            assert cut_short(sidecar) is None
            os.kill(sidecar.pid, signal.SIGTERM)
            record = eventually(lambda: cut_short(sidecar), "the stop cut short",
                                RECORD_WAIT_S)
        assert record["reason"] == "was signalled again"
        assert record["step"].startswith("the cache to close: ")
        assert record["waited_s"] < RECORD_WAIT_S
    finally:
        status = sidecar.stop()
    assert status == 1


def test_a_reader_that_never_reads_is_cut_off_within_the_bound_and_logged(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    access_log = tmp_path / "access.log"
    (tmp_path / "cache").mkdir()
    sidecar = start(local_s3, tmp_path / "cache", SIDECAR_ACCESS_LOG=str(access_log),
                    SIDECAR_STOP_TIMEOUT="4s").launch()
    reader = None
    try:
        sidecar.await_ready()
        key, data = cached_object(sidecar, origin_s3, bucket)
        address = urlsplit(sidecar.data_url)
        reader = socket.create_connection((address.hostname, address.port), timeout=10)
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.sendall(f"GET /{bucket}/{key} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert reader.recv(12) == b"HTTP/1.1 200"  # answering, and never read again
        sidecar.terminate()
    finally:
        status = sidecar.stop()
        if reader is not None:
            reader.close()
    assert cut_short(sidecar) is None
    assert status == 0
    lines = [json.loads(line) for line in access_log.read_text().splitlines()]
    held = [line for line in lines if line["request_id"] and line["bytes"] < len(data)]
    assert [(line["status"], line["cut_off"]) for line in held] == [(200, "stopped")]
