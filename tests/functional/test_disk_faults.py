"""A cache disk that loses data under a running sidecar: reads stay exact, the
process stays up, and a disk that keeps failing reads is bypassed.

Three faults, as a failing device or a mistaken operator makes them: the slab
file cut short, a hole punched into it, and real I/O errors from a file system
on a loop device whose backing file is cut short (reads of the lost part return
EIO, as they do from a dying disk). The tools for those come from Debian
(scripts/ensure-disk-tools.sh) when missing.
"""

from __future__ import annotations

import os
import random
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.cache.slot_format import FILE_HEADER_SIZE, SLAB_FILE_NAME, SLOT_HEADER_SIZE
from sidecar.tools.local_s3 import LocalS3
from tests.support.loop_disk import LoopDisk, drop_pages, ensure_disk_tools, loop_disk
from tests.support.loopback_http import raw_request
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

ROOT = Path(__file__).resolve().parents[2]
MiB = 1024 * 1024
BLOCK = MiB
SLOTS = 32


def put(origin_s3: Any, bucket: str, size: int) -> tuple[str, bytes]:
    key = f"disk-{secrets.token_hex(4)}.log"
    data = random.Random(size).randbytes(size)
    origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
    return key, data


def start(local_s3: LocalS3, cache_dir: Path, **env: str) -> SidecarProcess:
    return SidecarProcess(
        local_s3.endpoint, cache_dir, "--block-size", "1MiB",
        "--cache-size", str(SLOTS * (BLOCK + SLOT_HEADER_SIZE)),
        env={"SIDECAR_PREFETCH": "false", "SIDECAR_SCRUB_RATE": "0",
             # Every read goes to the slab: no verified chunk is kept in memory.
             "SIDECAR_RECENT_CHUNKS": "0", "SIDECAR_MEMORY_TIER": "0", **env},
    )


def cache_whole(sidecar: SidecarProcess, bucket: str, key: str, data: bytes) -> None:
    """Read the object through the sidecar until every block is cached, then
    push the slab's pages to the disk and out of the page cache, so that the
    next reads ask the disk."""
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
    blocks = -(-len(data) // BLOCK)
    eventually(lambda: sidecar.metric("sidecar_cache_blocks") >= blocks, "blocks cached")
    sidecar.wait_idle()
    assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[1]["x-sidecar-cache"] \
        == "hit"


def read_all_in_ranges(sidecar: SidecarProcess, bucket: str, key: str, data: bytes) -> None:
    """Every byte, 256 KiB at a time: each range is compared with the truth."""
    step = 256 * 1024
    for at in range(0, len(data), step):
        last = min(len(data), at + step) - 1
        status, _, body = raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}",
                                      {"Range": f"bytes={at}-{last}"})
        assert status == 206 and body == data[at:last + 1], at


def test_a_slab_cut_to_an_eighth_under_the_sidecar_costs_refetches_not_the_process(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    key, data = put(origin_s3, bucket, 8 * MiB)
    with start(local_s3, tmp_path) as sidecar:
        cache_whole(sidecar, bucket, key, data)
        slab = tmp_path / SLAB_FILE_NAME
        os.truncate(slab, slab.stat().st_size // 8)
        read_all_in_ranges(sidecar, bucket, key, data)
        assert sidecar.alive()
        assert sidecar.metric("sidecar_cache_checksum_failures_total") >= 1
        assert sidecar.metric("sidecar_cache_evictions_total", reason="checksum") >= 1
        # A short read is a lost block, not a failing disk: the cache heals as
        # the blocks are fetched and written again.
        assert sidecar.stats()["mode"] == "normal"
        sidecar.wait_idle()
        read_all_in_ranges(sidecar, bucket, key, data)
        assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[1]["x-sidecar-cache"] \
            == "hit"
        failed = sum(sidecar.metric("sidecar_requests_total", op="GetObject", code=code)
                     for code in ("500", "503"))
        assert failed == 0
    assert sidecar.stop() == 0


def test_a_hole_punched_into_the_slab_reads_as_zeros_and_is_refetched(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    key, data = put(origin_s3, bucket, 6 * MiB)
    with start(local_s3, tmp_path) as sidecar:
        cache_whole(sidecar, bucket, key, data)
        slab = tmp_path / SLAB_FILE_NAME
        # The data of every slot, headers left alone: each block reads as zeros.
        for slot in range(SLOTS):
            data_at = FILE_HEADER_SIZE + slot * (SLOT_HEADER_SIZE + BLOCK) + SLOT_HEADER_SIZE
            subprocess.run(["fallocate", "--punch-hole", "--offset", str(data_at),
                            "--length", str(BLOCK), str(slab)], check=True)
        read_all_in_ranges(sidecar, bucket, key, data)
        assert sidecar.alive()
        assert sidecar.metric("sidecar_cache_checksum_failures_total") >= 6
        assert sidecar.metric("sidecar_cache_disk_errors_total") == 0
        assert sidecar.stats()["mode"] == "normal"
    assert sidecar.stop() == 0


@pytest.fixture(scope="module", autouse=True)
def disk_tools() -> None:
    ensure_disk_tools()


@pytest.fixture
def cache_disk(tmp_path: Path) -> Iterator[LoopDisk]:
    """An ext4 file system on a loop device over a 96 MiB file."""
    with loop_disk(tmp_path, 96 * MiB) as disk:
        yield disk


def test_a_disk_that_fails_reads_with_eio_is_bypassed_and_every_read_stays_exact(
    local_s3: LocalS3, origin_s3: Any, bucket: str, cache_disk: LoopDisk
) -> None:
    mount, backing = cache_disk.mount, cache_disk.backing
    objects = [put(origin_s3, bucket, 6 * MiB + n) for n in range(4)]  # 28 blocks
    with start(local_s3, mount, SIDECAR_DISK_CHECK_INTERVAL="30s") as sidecar:
        for key, data in objects:
            cache_whole(sidecar, bucket, key, data)
        drop_pages(mount / SLAB_FILE_NAME)
        # The device loses all but its first 4 MiB: its superblock and, as
        # the slab's extents lie beyond it, none of the cached blocks.
        os.truncate(backing, 4 * MiB)
        for key, data in objects:
            read_all_in_ranges(sidecar, bucket, key, data)
        assert sidecar.alive()
        assert sidecar.metric("sidecar_cache_disk_errors_total", op="read") >= 1
        assert sidecar.metric("sidecar_cache_checksum_failures_total") >= 16
        assert sidecar.metric("sidecar_mode", mode="bypass") == 1
        assert sidecar.stats()["mode"] == "bypass"
        status, _, body = raw_request(sidecar.admin_url, "GET", "/readyz")
        assert status == 200 and b"bypass" in body and b"cache disk reads" in body
        assert any("cache disk failed" in line for line in sidecar.stderr_lines)
        # Bypassed: the origin serves every read, exactly.
        for key, data in objects:
            assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
        failed = sum(sidecar.metric("sidecar_requests_total", op="GetObject", code=code)
                     for code in ("500", "503"))
        assert failed == 0
    assert sidecar.stop() == 0
