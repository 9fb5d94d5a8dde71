"""Crash and corruption survival of the block cache, with the sidecar as a real process.

`kill -9` in the middle of heavy cache writes, many times at random moments:
after every restart each byte served equals the origin's, the blocks that were
in the cache come back (cache.recovery in /api/v1/stats) and are served
without an origin read. Then the slab file is damaged on purpose (bytes
flipped in data and headers, the file truncated, its header overwritten): the
sidecar starts, serves correct bytes and reports what it dropped. A summary of
the crash cycles goes to test-artifacts/reliability/crash.json for
RELIABILITY.md.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sidecar.tools.local_s3 import LocalS3
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

pytestmark = pytest.mark.functional

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = ROOT / "test-artifacts" / "reliability" / "crash.json"
BLOCK = 64 * 1024
SLOT = BLOCK + 4096
SLOTS = 96
CYCLES = 8
SEED = 7
# Read-ahead off: every block written is one a client asked for, so the
# hammering is all foreground cache writes and the counts stay readable.
ENV = {"SIDECAR_PREFETCH": "false"}
FLAGS = ("--block-size", "64KiB", "--cache-size", str(SLOTS * SLOT))


@dataclass
class Tally:
    bytes_verified: int = 0
    wrong_bytes: int = 0
    requests: int = 0
    cut_by_kill: int = 0
    errors: list[str] = field(default_factory=list)


def put_objects(origin_s3: Any, bucket: str, rng: random.Random, count: int) -> dict[str, bytes]:
    objects = {}
    for n in range(count):
        key = f"orders-x/{n}/{n * 1000:020d}-seg.log"
        data = rng.randbytes(rng.randrange(18, 30) * BLOCK + rng.randrange(BLOCK))
        origin_s3.put_object(Bucket=bucket, Key=key, Body=data)
        objects[key] = data
    return objects


def get(url: str, bucket: str, key: str, first: int, last: int | None,
        connection: http.client.HTTPConnection | None = None) -> tuple[int, bytes]:
    """One ranged GET; (status, body). Raises on a connection problem."""
    own = connection is None
    if connection is None:
        address = urlsplit(url)
        connection = http.client.HTTPConnection(address.hostname, address.port, timeout=20)
    try:
        span = f"bytes={first}-" + ("" if last is None else str(last))
        connection.request("GET", f"/{bucket}/{key}", headers={"Range": span})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        if own:
            connection.close()


def compare(tally: Tally, expected: bytes, got: bytes) -> None:
    tally.bytes_verified += len(got)
    if got != expected[:len(got)]:
        # The lengths may differ (an answer cut short): bytes are compared as far as
        # both go, and a mismatch in length alone still counts.
        tally.wrong_bytes += sum(a != b for a, b in zip(got, expected, strict=False)) or 1


def hammer(url: str, bucket: str, objects: dict[str, bytes], rng: random.Random,
           stop: threading.Event, killed: threading.Event, tally: Tally, lock: threading.Lock
           ) -> None:
    """Random ranges of random objects until stopped; every byte checked."""
    address = urlsplit(url)
    keys = sorted(objects)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=20)
    try:
        for _ in range(100_000):  # bounded; the stop event ends it long before
            if stop.is_set():
                return
            key = rng.choice(keys)
            data = objects[key]
            first = rng.randrange(len(data))
            last = min(len(data) - 1, first + rng.choice([1000, BLOCK, 3 * BLOCK, 6 * BLOCK]))
            try:
                status, body = get(url, bucket, key, first, last, connection)
            except http.client.IncompleteRead as exc:
                with lock:
                    compare(tally, data[first:last + 1], exc.partial)
                    if killed.is_set():
                        tally.cut_by_kill += 1
                    else:
                        tally.errors.append(repr(exc))
                return
            except (OSError, http.client.HTTPException) as exc:
                if killed.is_set():
                    with lock:
                        tally.cut_by_kill += 1
                    return
                with lock:
                    tally.errors.append(repr(exc))
                return
            with lock:
                tally.requests += 1
                if status != 206:
                    tally.errors.append(f"status {status}")
                compare(tally, data[first:last + 1], body)
    finally:
        connection.close()


def recovery(process: SidecarProcess) -> dict[str, Any]:
    """cache.recovery once the start's scan of the slot headers is over (the
    sidecar serves while it runs, its counts growing)."""
    def report() -> dict[str, Any]:
        cache = process.stats()["cache"]
        assert isinstance(cache, dict)
        found = cache["recovery"]
        assert isinstance(found, dict)
        return found

    eventually(lambda: not report()["scanning"], "the start's scan to finish", timeout=30.0)
    done = report()
    assert done["slots_scanned"] == done["slots_to_scan"] or done["index"] == "snapshot"
    return done


def verify_sample(process: SidecarProcess, bucket: str, objects: dict[str, bytes],
                  rng: random.Random, tally: Tally, whole: int = 2, ranges: int = 16) -> None:
    keys = sorted(objects)
    for key in rng.sample(keys, whole):
        status, body = get(process.data_url, bucket, key, 0, None)
        assert status == 206
        compare(tally, objects[key], body)
        assert len(body) == len(objects[key])
    for _ in range(ranges):
        key = rng.choice(keys)
        data = objects[key]
        first = rng.randrange(len(data))
        last = min(len(data) - 1, first + rng.randrange(1, 4 * BLOCK))
        status, body = get(process.data_url, bucket, key, first, last)
        assert status == 206
        compare(tally, data[first:last + 1], body)
        assert len(body) == last - first + 1


def test_kill_9_during_heavy_writes_loses_no_byte_and_reuses_the_cache(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    # About 150 blocks of data for 96 slots: the hammering keeps evicting and
    # rewriting slots, the crash-prone path (a slot with a valid old header).
    objects = put_objects(origin_s3, bucket, rng, 6)
    cache = tmp_path / "cache"
    cache.mkdir()
    tally = Tally()
    cycles: list[dict[str, Any]] = []
    started = time.monotonic()
    process = SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV).__enter__()
    try:
        for cycle in range(CYCLES + 1):
            report = recovery(process)
            if cycle:
                # Every block the cache held before the kill (but the few whose
                # write was cut) comes back, none of them damaged: a process
                # crash leaves each slot either whole or marked empty.
                previous = cycles[-1]
                previous.update(
                    recovered=report["blocks_recovered"], corrupt=report["corrupt_headers"],
                    duplicates=report["duplicates"], recovery_s=report["seconds"],
                    file=report["file"],
                )
                assert report["file"] == "reused"
                # The index snapshot was taken by the start before: a kill -9
                # leaves none, the headers are scanned.
                assert report["index"] == "scan"
                assert report["corrupt_headers"] == 0
                assert report["blocks_recovered"] >= previous["blocks_before_kill"] // 2 > 0
                before = process.stats()
                verify_sample(process, bucket, objects, rng, tally)
                after = process.stats()
                served = after["served_bytes"]
                assert isinstance(served, dict)
                # Recovered blocks were read without an origin request.
                assert after["hits"] > before["hits"]  # type: ignore[operator]
                assert served["cache"] > 0
                assert process.metric("sidecar_cache_checksum_failures_total") == 0
                previous.update(hits_after_restart=after["hits"],
                                cache_bytes_after_restart=served["cache"])
            if cycle == CYCLES:
                break
            stop, killed, lock = threading.Event(), threading.Event(), threading.Lock()
            threads = [
                threading.Thread(target=hammer, args=(
                    process.data_url, bucket, objects, random.Random(rng.random()),
                    stop, killed, tally, lock))
                for _ in range(3)
            ]
            for thread in threads:
                thread.start()
            time.sleep(rng.uniform(0.4, 1.5))
            stats = process.stats()
            cache_stats, origin_stats = stats["cache"], stats["origin"]
            assert isinstance(cache_stats, dict) and isinstance(origin_stats, dict)
            killed.set()
            os.kill(process.pid, signal.SIGKILL)
            stop.set()
            for thread in threads:
                thread.join(timeout=30)
                assert not thread.is_alive()
            process.stop()
            cycles.append({
                "cycle": cycle + 1, "blocks_before_kill": cache_stats["blocks"],
                # Churn since this process started: blocks fetched and written,
                # blocks evicted to make room.
                "origin_gets_before_kill": origin_stats["requests"]["ok"],
                "evictions_before_kill": cache_stats["evictions"],
            })
            process = SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV).__enter__()
        assert tally.errors == []
        assert tally.wrong_bytes == 0
    finally:
        process.stop()
    summary = {
        "test": "tests/functional/test_crash_recovery.py",
        "cycles": CYCLES,
        "block_size": BLOCK,
        "slots": SLOTS,
        "object_bytes": sum(map(len, objects.values())),
        "requests": tally.requests,
        "responses_cut_by_kill": tally.cut_by_kill,
        "bytes_verified": tally.bytes_verified,
        "wrong_bytes": tally.wrong_bytes,
        "blocks_before_kill": [c["blocks_before_kill"] for c in cycles],
        "blocks_recovered": [c["recovered"] for c in cycles],
        "reuse_ratio": round(sum(c["recovered"] for c in cycles)
                             / max(1, sum(c["blocks_before_kill"] for c in cycles)), 3),
        "corrupt_headers": sum(c["corrupt"] for c in cycles),
        "origin_gets_before_kills": sum(c["origin_gets_before_kill"] for c in cycles),
        "evictions_before_kills": sum(c["evictions_before_kill"] for c in cycles),
        "recovery_seconds_max": max(c["recovery_s"] for c in cycles),
        "seconds": round(time.monotonic() - started, 1),
        "per_cycle": cycles,
    }
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")


def filled_cache(local_s3: LocalS3, objects: dict[str, bytes], bucket: str, cache: Path
                 ) -> int:
    """Read every object through a sidecar, stop it cleanly; the blocks cached."""
    with SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV) as process:
        for key, data in objects.items():
            assert get(process.data_url, bucket, key, 0, None) == (206, data)
        every_block = sum(-(-len(data) // BLOCK) for data in objects.values())
        eventually(lambda: process.metric("sidecar_cache_blocks") >= every_block,
                   f"all {every_block} blocks in the cache", timeout=10.0)
        blocks = int(process.metric("sidecar_cache_blocks"))
    assert (cache / "index.snap").exists()  # a clean stop saves the index
    return blocks


def test_a_clean_stop_and_start_takes_the_index_over_and_serves_from_it(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    rng = random.Random("clean")
    objects = put_objects(origin_s3, bucket, rng, 3)
    cache = tmp_path / "cache"
    cache.mkdir()
    blocks = filled_cache(local_s3, objects, bucket, cache)
    with SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV) as process:
        report = recovery(process)
        assert report["index"] == "snapshot" and report["file"] == "reused"
        assert report["blocks_recovered"] == blocks and report["corrupt_headers"] == 0
        # Taken and deleted before the first write: a kill -9 from here on
        # cannot leave a snapshot older than the slab.
        assert not (cache / "index.snap").exists()
        tally = Tally()
        for key, data in objects.items():
            status, body = get(process.data_url, bucket, key, 0, None)
            assert status == 206
            compare(tally, data, body)
        assert tally.wrong_bytes == 0 and tally.errors == []
        # Every byte came from the cache: no block read from the origin again.
        served = process.stats()["served_bytes"]
        assert isinstance(served, dict)
        assert served["cache"] == sum(map(len, objects.values())) and served["origin"] == 0
        assert process.metric("sidecar_cache_checksum_failures_total") == 0
        os.kill(process.pid, signal.SIGKILL)
        process.stop()
    with SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV) as process:
        report = recovery(process)
        assert report["index"] == "scan" and report["blocks_recovered"] == blocks


@pytest.mark.parametrize("damage", ["flipped", "truncated", "file-header", "garbage-index"])
def test_a_damaged_slab_is_survived_and_reported(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path, damage: str
) -> None:
    rng = random.Random(damage)
    # 3 objects of 18..30 blocks: they fit the 96 slots together.
    objects = put_objects(origin_s3, bucket, rng, 3)
    cache = tmp_path / "cache"
    cache.mkdir()
    blocks = filled_cache(local_s3, objects, bucket, cache)
    # Damage is what the headers' scan must find: as after a kill -9, no index
    # snapshot (one older than the damage would not be used either, see
    # tests/unit/test_cache_recovery.py).
    (cache / "index.snap").unlink()
    slab = cache / "slab.dat"
    size = slab.stat().st_size
    used = [slot for slot in range(SLOTS) if _header_valid(slab, slot)]
    assert len(used) == blocks
    flipped_headers: list[int] = []
    flipped_data: list[int] = []
    with slab.open("r+b") as handle:
        def flip(offset: int) -> None:
            handle.seek(offset)
            byte = handle.read(1)[0]
            handle.seek(offset)
            handle.write(bytes([byte ^ rng.randrange(1, 256)]))

        if damage == "flipped":
            chosen = rng.sample(used, 12)
            flipped_headers, flipped_data = sorted(chosen[:4]), sorted(chosen[4:])
            for slot in flipped_headers:  # inside the checksummed names
                flip(4096 + slot * SLOT + 40 + rng.randrange(20))
            for slot in flipped_data:  # somewhere in the block's bytes
                handle.seek(4096 + slot * SLOT + 8)
                length = int.from_bytes(handle.read(4), "little")
                flip(4096 + slot * SLOT + 4096 + rng.randrange(length))
        elif damage == "truncated":
            handle.truncate(size // 2 + 1234)
        elif damage == "garbage-index":  # every slot header (the index) is noise
            for slot in range(SLOTS):
                handle.seek(4096 + slot * SLOT)
                handle.write(rng.randbytes(4096))
        else:
            handle.seek(0)
            handle.write(rng.randbytes(4096))

    with SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV) as process:
        report = recovery(process)
        tally = Tally()
        for key, data in objects.items():
            status, body = get(process.data_url, bucket, key, 0, None)
            assert status == 206
            compare(tally, data, body)
        for _ in range(10):
            key = rng.choice(sorted(objects))
            data = objects[key]
            first = rng.randrange(len(data))
            status, body = get(process.data_url, bucket, key, first, None)
            compare(tally, data[first:], body)
            assert len(body) == len(data) - first
        assert tally.wrong_bytes == 0
        failures = process.metric("sidecar_cache_checksum_failures_total")
        dropped = process.metric("sidecar_cache_evictions_total", reason="recovery")
        if damage == "flipped":
            assert report["file"] == "reused"
            assert report["corrupt_headers"] == len(flipped_headers) == dropped
            assert report["blocks_recovered"] == blocks - len(flipped_headers)
            assert failures == len(flipped_data)  # found on read, refetched
            assert process.stats()["cache"]["checksum_failures"] == failures  # type: ignore[index]
        elif damage == "truncated":
            assert report["file"] == "truncated" and "kept the" in report["reason"]
            kept = report["slots_scanned"]
            assert 0 < kept < SLOTS
            assert report["blocks_recovered"] == len([s for s in used if s < kept]) > 0
            assert slab.stat().st_size == size and failures == 0
        elif damage == "garbage-index":
            assert report["file"] == "reused"
            assert report["corrupt_headers"] == SLOTS == dropped
            assert report["blocks_recovered"] == 0 and failures == 0
            dropped_line = f"cache recovery dropped {SLOTS} slot headers: {SLOTS} corrupt"
            eventually(lambda: any(dropped_line in line for line in process.stderr_lines),
                       f"{dropped_line!r} in stderr", timeout=10.0)
        else:
            assert report["recreated"] and "file header" in report["reason"]
            assert report["blocks_recovered"] == 0 and failures == 0
        if damage in ("truncated", "file-header"):  # said at start, as a WARNING
            eventually(lambda: any(report["reason"] in line for line in process.stderr_lines),
                       f"{report['reason']!r} in stderr", timeout=10.0)
        cached_after = int(process.metric("sidecar_cache_blocks"))
    if damage == "garbage-index":
        # The noise was erased on disk: the next start finds only the blocks cached since.
        with SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV) as process:
            again = recovery(process)
        assert again["corrupt_headers"] == 0
        assert again["blocks_recovered"] == cached_after > 0


def _header_valid(slab: Path, slot: int) -> bool:
    with slab.open("rb") as handle:
        handle.seek(4096 + slot * SLOT)
        head = handle.read(8)
    return head[:4] == b"SLOT" and head[6] & 1 == 1


def test_a_slab_file_replaced_under_a_running_sidecar_is_not_described_by_its_snapshot(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    """The slab file is replaced by a copy of itself while the sidecar runs (a
    restore from a backup, a tool that rewrites files by copy and rename): the
    sidecar goes on writing to the file it has open, and its snapshot at the
    clean stop describes that file, not the copy now at the path. Before, the
    snapshot recorded the path's inode, size and time, the copy's, and the next
    start took it over for the copy: every block cached after the copy was
    missing there, each read of one a checksum failure (and enough of them put
    the sidecar in bypass)."""
    objects = put_objects(origin_s3, bucket, random.Random("replaced"), 4)
    early, late = list(objects)[:2], list(objects)[2:]
    cache = tmp_path / "cache"
    cache.mkdir()
    slab = cache / "slab.dat"

    def read_through(process: SidecarProcess, keys: list[str]) -> None:
        for key in keys:
            assert get(process.data_url, bucket, key, 0, None) == (206, objects[key])
        process.wait_idle()

    with SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV) as process:
        read_through(process, early)
        shutil.copyfile(slab, cache / "slab.copy")
        os.replace(cache / "slab.copy", slab)
        read_through(process, late)
        cached = process.metric("sidecar_cache_blocks")
    assert process.stop() == 0 and (cache / "index.snap").exists()
    with SidecarProcess(local_s3.endpoint, cache, *FLAGS, env=ENV) as process:
        report = recovery(process)
        assert report["index"] == "scan"
        assert any("index snapshot of another slab file" in line
                   for line in process.stderr_lines)
        # The copy holds the blocks cached before it was made, and only those.
        early_blocks = sum(-(-len(objects[key]) // BLOCK) for key in early)
        assert report["blocks_recovered"] == early_blocks < cached
        read_through(process, list(objects))
        assert process.metric("sidecar_cache_checksum_failures_total") == 0
        assert process.stats()["mode"] == "normal"
