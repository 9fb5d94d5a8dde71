"""`python -m bench.origin_floor`: what a cold block costs on its way in, with
nothing else: the floor under the sidecar's origin threads.

Reads every whole block (`--block-size`, 8 MiB) of the segments named in `--segments` (the light
client's file) from `--endpoint` (the bench origin: 30 ms to first byte, 64
MB/s a connection) with the sidecar's own ranged GET reader
(sidecar.origin.range_reader: one thread per connection, each 1 MiB chunk
received with recv_into into a reused page-aligned buffer), in `--threads`
threads at once. `--work` says what is done with each chunk as it lands:

- `receive`: nothing;
- `hash`: its xxh3 checksum (sidecar.cache.slot_format.chunk_checksum);
- `write`: the checksum, then written past the page cache (O_DIRECT) into a
  scratch file under `--scratch` on the cache's disk, as the sidecar writes
  a chunk into its slot;
- `tier`: `write`, then copied into a memory tier large enough for every
  block (sidecar.cache.memory_tier, the sidecar's own), as a sidecar whose
  tier holds the data set keeps each chunk that lands. Its pages are taken
  before the clock starts, as the sidecar takes them at start
  (memory_tier_reserve); `tier-fresh`: the same into pages the kernel has
  yet to give, as with memory_tier_reserve = false.

No cache index, no event loop, no readers: a cold replay through the sidecar
pays this, the warm replay's serving and what ties the two together. Prints
one JSON object: bytes, seconds, MB/s and the process's own CPU (getrusage:
every thread), per GiB received.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

from bench.clients import head
from sidecar.cache.ident import BlockIdent
from sidecar.cache.memory_tier import MemoryTier
from sidecar.cache.slot_format import chunk_checksum
from sidecar.origin.range_reader import Progress, RangeReader

WORK = ("receive", "hash", "write", "tier", "tier-fresh")
BLOCK = 8 * 1024 * 1024
CHUNK = 1024 * 1024
# Slots of the scratch file the blocks land in, round robin.
SCRATCH_SLOTS = 16
_GIB = 1024 ** 3


def etag_of(endpoint: str, path: str) -> str:
    status, fields = head(endpoint, path, timeout_s=30)
    etag = fields.get("etag")
    if status != 200 or not etag:
        raise SystemExit(f"python -m bench.origin_floor: HEAD {path}: {status}")
    return etag


def blocks_of(endpoint: str, bucket: str, segments: dict[str, Any], block: int
              ) -> list[tuple[str, int, str, int]]:
    """(URL, size, ETag, first byte) of every whole block of every segment."""
    found = []
    for partition in segments["partitions"].values():
        for segment in partition:
            path = f"/{bucket}/{quote(str(segment['key']), safe='/~')}"
            size = int(segment["size"])
            etag = etag_of(endpoint, path)
            found += [(endpoint + path, size, etag, start)
                      for start in range(0, size - block + 1, block)]
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.origin_floor",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--endpoint", required=True, help="the bench origin's URL")
    parser.add_argument("--bucket", required=True)
    parser.add_argument("--segments", type=Path, required=True,
                        help="the light client's JSON of each partition's segments")
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=BLOCK,
                        help="bytes a GET, a multiple of 1 MiB (the chunk)")
    parser.add_argument("--work", choices=WORK, default="write")
    parser.add_argument("--scratch", type=Path, required=True,
                        help="a directory on the cache's disk, for --work write")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be at least 1")
    block = args.block_size
    if block < CHUNK or block % CHUNK:
        parser.error(f"--block-size must be a multiple of {CHUNK}")

    jobs = blocks_of(args.endpoint, args.bucket, json.loads(args.segments.read_text()), block)
    scratch = args.scratch / "origin-floor.slab"
    try:
        fd = os.open(scratch, os.O_RDWR | os.O_CREAT | os.O_DIRECT, 0o600)
    except OSError as exc:
        parser.error(f"cannot open {scratch} with O_DIRECT: {exc.strerror}")
    os.ftruncate(fd, SCRATCH_SLOTS * block)
    reader = RangeReader(connect_timeout_s=10, stall_timeout_s=30, max_chunk_size=CHUNK)
    lock = threading.Lock()
    failures: list[str] = []

    # Room for every chunk: no region is ever evicted, as with a tier that
    # holds the data set.
    tier = MemoryTier(len(jobs) * block, CHUNK) if args.work.startswith("tier") else None
    if tier is not None and args.work == "tier":
        tier.reserve(0, tier.size_bytes)

    def sink_for(slot: int, url: str, etag: str) -> Any:
        def take(offset: int, data: memoryview) -> None:
            if args.work != "receive":
                chunk_checksum(data)
            if args.work in ("write", "tier", "tier-fresh"):
                os.pwrite(fd, data, slot * block + offset % block)
            if tier is not None:
                ident = BlockIdent(args.bucket, url, etag, offset // block)
                tier.put((ident, 0, offset % block // CHUNK), data, read=False)
        return take

    def work() -> None:
        while True:
            with lock:
                if not jobs or failures:
                    return
                url, size, etag, start = jobs.pop()
                slot = len(jobs) % SCRATCH_SLOTS
            try:
                reader.read(url, start + block, etag, size, sink_for(slot, url, etag),
                            Progress(start), CHUNK)
            except Exception as exc:  # reported, and the run stops
                with lock:
                    failures.append(f"{url} at {start}: {exc!r}")
                return

    total = len(jobs) * block
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    threads = [threading.Thread(target=work, name=f"floor-origin-{n}")
               for n in range(args.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    reader.close()
    os.close(fd)
    if tier is not None:
        tier.close()
    scratch.unlink()
    gib = total / _GIB
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    print(json.dumps({
        "work": args.work, "threads": args.threads, "bytes": total,
        "seconds": round(seconds, 3), "mb_per_s": round(total / seconds / 1e6, 2),
        "server_cpu_per_gib": {
            "user": round(user / gib, 3), "system": round(system / gib, 3),
            "total": round((user + system) / gib, 3),
            "minor_faults": round((after.ru_minflt - before.ru_minflt) / gib),
        },
        "voluntary_switches_per_gib": round((after.ru_nvcsw - before.ru_nvcsw) / gib),
        "errors": len(failures), "error_messages": failures[:5],
    }))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
