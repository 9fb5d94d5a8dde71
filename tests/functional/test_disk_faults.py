"""A cache disk that loses data under a running sidecar: reads stay exact, the
process stays up, and a disk that keeps failing reads is bypassed.

Three faults, as a failing device or a mistaken operator makes them: the slab
file cut short, a hole punched into it, and real I/O errors from a file system
on a loop device whose backing file is cut short (reads of the lost part return
EIO, as they do from a dying disk). The tools for those come from Debian
(scripts/ensure-disk-tools.sh) when missing.
"""

from __future__ import annotations

import json
import os
import random
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.cache.slot_format import (
    FILE_HEADER_SIZE,
    SLAB_FILE_NAME,
    SLOT_HEADER_SIZE,
    slot_offset,
)
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
        # Bypassed either way: after 16 reads that do not match their checksums,
        # or at once when the refetch of the first dropped block fails its write
        # (the device is cut short under it), before the next read comes.
        assert sidecar.metric("sidecar_cache_checksum_failures_total") >= 1
        assert sidecar.metric("sidecar_mode", mode="bypass") == 1
        assert sidecar.stats()["mode"] == "bypass"
        status, _, body = raw_request(sidecar.admin_url, "GET", "/readyz")
        ready = json.loads(body)
        assert status == 200 and ready["mode"] == "bypass"
        # Named by whichever of the two came first: the reads, or the write's EIO.
        assert "cache disk reads" in ready["disk_problem"] \
            or "Input/output error" in ready["disk_problem"], ready
        assert any("cache disk failed" in line for line in sidecar.stderr_lines)
        # Bypassed: the origin serves every read, exactly.
        for key, data in objects:
            assert raw_request(sidecar.data_url, "GET", f"/{bucket}/{key}")[2] == data
        failed = sum(sidecar.metric("sidecar_requests_total", op="GetObject", code=code)
                     for code in ("500", "503"))
        assert failed == 0
    assert sidecar.stop() == 0


def physical_offset(path: Path, logical: int) -> int:
    """Where byte `logical` of the file lies on its device (filefrag(8), FIEMAP)."""
    listing = subprocess.run(["filefrag", "-v", "-b1", str(path)], check=True,
                             capture_output=True, text=True).stdout
    for line in listing.splitlines():
        fields = line.replace(":", " ").replace("..", " ").split()
        if len(fields) >= 6 and fields[0].isdigit():
            first, last, physical = int(fields[1]), int(fields[2]), int(fields[3])
            if first <= logical <= last:
                return physical + logical - first
    raise AssertionError(f"byte {logical} of {path} not mapped:\n{listing}")


def test_a_slot_header_the_disk_cannot_read_costs_its_slot_not_the_restart_scan(
    local_s3: LocalS3, origin_s3: Any, bucket: str, cache_disk: LoopDisk
) -> None:
    """After a crash the start scans the slot headers. Before, the first header
    the disk failed to read (EIO) stopped the scan and threw away its whole
    batch (1,024 slots): nothing was recovered, no slot was ever freed, and the
    cache served every read from the origin, at every start, until the disk
    was replaced."""
    mount, backing = cache_disk.mount, cache_disk.backing
    slab = mount / SLAB_FILE_NAME
    objects = [put(origin_s3, bucket, 6 * MiB + n) for n in range(1, 5)]  # 28 blocks
    sidecar = start(local_s3, mount)
    try:
        sidecar.launch().await_ready()
        for key, data in objects:
            cache_whole(sidecar, bucket, key, data)
    finally:
        sidecar.kill()  # no index snapshot: the next start scans
    drop_pages(slab)
    # Slots are handed out lowest first: the blocks are in slots 0..27. The
    # device loses everything from slot 27's header on: that header fails with
    # EIO (slots never written, 28..31, read as zeros without asking the device).
    cut = physical_offset(slab, slot_offset(27, BLOCK))
    assert physical_offset(slab, slot_offset(26, BLOCK) + SLOT_HEADER_SIZE + BLOCK - 1) < cut
    os.truncate(backing, cut)
    with start(local_s3, mount) as again:
        def scanned() -> dict[str, Any] | None:
            found: dict[str, Any] = again.stats()["cache"]["recovery"]  # type: ignore[index]
            return None if found["scanning"] else found
        recovery = eventually(scanned, "the scan to finish", 10)
        assert recovery["slots_scanned"] == SLOTS
        assert recovery["blocks_recovered"] == 27, json.dumps(recovery)
        assert again.metric("sidecar_cache_disk_errors_total", op="read") == 1
        assert any("failed to read 1 slot headers (slots 27)" in line
                   for line in again.stderr_lines)
        for key, data in objects:
            read_all_in_ranges(again, bucket, key, data)
        # 27 blocks were hits; the one whose header was lost came from the origin
        # into a free slot, so the cache still takes blocks. Its write may land
        # after the read that fetched it has been answered.
        again.wait_idle()
        assert again.metric("sidecar_cache_blocks") == 28
        assert again.alive()
    assert again.stop() == 0
