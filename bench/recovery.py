"""How long a warm restart takes to index a large cache: `python -m bench.recovery`.

Builds a sparse slab (no preallocation, so it costs ~4 KiB of disk per slot)
of `--slots` slots of `--block-size` bytes, writes a valid slot header into
most of them (`--fill`, default 95%; Aiven-layout keys, 64 KiB blocks of 8 MiB
segments) and a damaged one into a few (`--corrupt`), leaves the data areas as
holes (recovery never reads data), then fsyncs and drops the file from the page
cache (posix_fadvise DONTNEED) so that the timed `BlockStore.open` reads the
headers from the disk rather than from memory. Prints one JSON line:
{"slots", "recovered", "corrupt_headers", "seconds", "build_seconds", ...}.

The target (issue 7) is 100k slots indexed in under 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sidecar.cache.ident import BlockIdent
from sidecar.cache.slab import (
    SLAB_FILE_NAME,
    SLOT_HEADER_SIZE,
    Slab,
    chunk_size_for,
    encode_slot_header,
    slab_file_size,
)
from sidecar.cache.store import BlockStore

SEGMENT_BYTES = 8 * 1024 * 1024


class _Counts:
    """The store's metrics sink (CacheMetrics), counting only."""

    def __init__(self) -> None:
        self.evictions = 0
        self.checksum_failures = 0

    def on_eviction(self, reason: str) -> None:
        self.evictions += 1

    def on_checksum_failure(self) -> None:
        self.checksum_failures += 1


def _segment(rng: random.Random, segment: int) -> tuple[str, str]:
    """Key (Aiven layout) and ETag of one segment object."""
    segment_id = base64.urlsafe_b64encode(rng.randbytes(16)).decode().rstrip("=")
    key = f"orders-zsckC2ZfQC-X8qX35_Uotg/{segment % 12}/{segment * 8169:020d}-{segment_id}.log"
    return key, f'"{rng.randbytes(16).hex()}"'


def build(directory: Path, slots: int, block_size: int, fill: float, corrupt: int,
          seed: int) -> tuple[int, int]:
    """Write the slab; returns (valid headers written, corrupt headers written)."""
    rng = random.Random(seed)
    Slab.open(directory, slots, block_size, preallocate=False).close()
    chunk = chunk_size_for(block_size)
    per_segment = SEGMENT_BYTES // block_size
    valid = 0
    segments: dict[int, tuple[str, str]] = {}
    damaged = set(rng.sample(range(slots), corrupt))
    path = directory / SLAB_FILE_NAME
    fd = os.open(path, os.O_RDWR)
    try:
        for slot in range(slots):
            if slot not in damaged and rng.random() >= fill:
                continue
            segment, block = divmod(slot, per_segment)
            ident = BlockIdent("tiered", *segments.setdefault(segment, _segment(rng, segment)),
                               block)
            checksums = tuple(rng.getrandbits(64) for _ in range(-(-block_size // chunk)))
            header = bytearray(encode_slot_header(ident, slot + 1, block_size, chunk, checksums))
            if slot in damaged:
                header[-1] ^= 0xFF  # the header checksum no longer matches
            else:
                valid += 1
            os.pwrite(fd, header, 4096 + slot * (SLOT_HEADER_SIZE + block_size))
        os.fsync(fd)
        # Cold start: the headers must come from the disk, not the page cache.
        os.posix_fadvise(fd, 0, slab_file_size(slots, block_size), os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return valid, len(damaged)


async def timed_open(directory: Path, slots: int, block_size: int,
                     io_threads: int) -> dict[str, Any]:
    counts = _Counts()
    with ThreadPoolExecutor(max_workers=io_threads) as executor:
        started = time.perf_counter()
        store = await BlockStore.open(
            directory, slots * (SLOT_HEADER_SIZE + block_size), block_size, executor, counts,
            preallocate=False,
        )
        seconds = time.perf_counter() - started
        report = store.recovery
        await store.close()
    assert report is not None
    return {"seconds": round(seconds, 3), "recovery": report.as_dict(),
            "dropped_counted": counts.evictions}


def run(slots: int, block_size: int, fill: float, corrupt: int, io_threads: int,
        directory: Path | None, seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-recovery-", dir=directory) as tmp:
        where = Path(tmp)
        started = time.perf_counter()
        valid, damaged = build(where, slots, block_size, fill, corrupt, seed)
        built = time.perf_counter() - started
        result = asyncio.run(timed_open(where, slots, block_size, io_threads))
    recovery = result["recovery"]
    return {
        "slots": slots,
        "block_size": block_size,
        "valid_headers_written": valid,
        "corrupt_headers_written": damaged,
        "recovered": recovery["blocks_recovered"],
        "corrupt_headers": recovery["corrupt_headers"],
        "seconds": result["seconds"],
        "target_seconds": 2.0,
        "io_threads": io_threads,
        "build_seconds": round(built, 3),
        "ok": recovery["blocks_recovered"] == valid and recovery["corrupt_headers"] == damaged,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.recovery",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--slots", type=int, default=100_000)
    parser.add_argument("--block-size", type=int, default=64 * 1024)
    parser.add_argument("--fill", type=float, default=0.95)
    parser.add_argument("--corrupt", type=int, default=100)
    parser.add_argument("--io-threads", type=int, default=4, help="the sidecar's io_threads")
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to build the slab (default: the temp dir)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args(argv)
    result = run(args.slots, args.block_size, args.fill, args.corrupt, args.io_threads,
                 args.dir, args.seed)
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
