"""What writing and reading cache blocks costs the process, one way against
another: `python -m bench.disk_io`.

The cache's bytes go through the disk one of a few ways, and on a broker node
every CPU-second of it is the broker's. This times each way over `--size`
bytes (1 GiB by default) in 1 MiB pieces (the cache's chunk) in a file in
`--dir` (put it on the cache disk), the process's own CPU (user + system,
getrusage) per GiB, `--rounds` times each, alternating:

  write, buffered            pwrite into the page cache, nothing else
  write, buffered + drop     the slab's way with drop_written_pages: pwrite,
                             then for each 8 MiB block sync_file_range(2)
                             (write and wait) and POSIX_FADV_DONTNEED
  write, O_DIRECT            pwrite from a page-aligned buffer, O_DIRECT: the
                             device reads the buffer, the page cache is not used
  read, page cache           pread of bytes already in the page cache
  read, buffered from disk   pread after POSIX_FADV_DONTNEED dropped them
  read, O_DIRECT             pread into a page-aligned buffer, O_DIRECT

Each write goes to a fresh file, preallocated (posix_fallocate) as the slab
is, after an untimed buffered write of the same size that makes the page
cache's pages ones the machine has touched before. Prints one JSON line per
round and way, and with `--record` keeps them in bench/results/disk-io.json
and writes bench/results/disk-io.md, the table `bench/report.py` splices into
BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import mmap
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from bench.machine import machine_info
from bench.recovery import drop_from_page_cache

MiB = 1024 * 1024
GiB = 1024 * MiB
BLOCK = 8 * MiB
RESULTS = Path(__file__).with_name("results")
COMMAND = "python -m bench.disk_io --dir DIR --rounds 3 --record"
# sync_file_range(2) flags: wait for earlier writeback, start it, wait for it.
_SYNC_ALL = 1 | 2 | 4
_libc = ctypes.CDLL(None, use_errno=True)
_libc.sync_file_range.argtypes = [ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong,
                                  ctypes.c_uint]

WAYS = ("write, buffered", "write, buffered + drop", "write, O_DIRECT",
        "read, page cache", "read, buffered from disk", "read, O_DIRECT")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _sync_range(fd: int, offset: int, length: int) -> None:
    if _libc.sync_file_range(fd, offset, length, _SYNC_ALL) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _fresh(path: Path, size: int) -> None:
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.posix_fallocate(fd, 0, size)
    finally:
        os.close(fd)


def _write(path: Path, size: int, buffer: mmap.mmap, direct: bool, drop: bool) -> None:
    fd = os.open(path, os.O_RDWR | (os.O_DIRECT if direct else 0))
    try:
        for offset in range(0, size, MiB):
            if os.pwrite(fd, buffer, offset) != MiB:
                raise OSError(f"a short write at {offset}")
            if drop and (offset + MiB) % BLOCK == 0:
                start = offset + MiB - BLOCK
                _sync_range(fd, start, BLOCK)
                os.posix_fadvise(fd, start, BLOCK, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _read(path: Path, size: int, buffer: mmap.mmap, direct: bool) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECT if direct else 0))
    try:
        for offset in range(0, size, MiB):
            if os.preadv(fd, [buffer], offset) != MiB:
                raise OSError(f"a short read at {offset}")
    finally:
        os.close(fd)


def _timed(work: Callable[[], None], size: int) -> dict[str, float]:
    cpu, wall = _cpu(), time.perf_counter()
    work()
    cpu, wall = _cpu() - cpu, time.perf_counter() - wall
    return {"cpu_s_per_gib": round(cpu * GiB / size, 3), "mb_per_s": round(size / 1e6 / wall, 1)}


def one_round(directory: Path, size: int) -> dict[str, dict[str, float]]:
    """Every way once, on files in `directory`."""
    # Page-aligned (an anonymous mapping), as O_DIRECT wants; random bytes, so
    # that no layer below may take a shortcut for zeros.
    buffer = mmap.mmap(-1, MiB)
    buffer.write(os.urandom(MiB))
    path = directory / "disk-io.dat"
    out: dict[str, dict[str, float]] = {}
    try:
        # Untimed: a first buffered write of `size` makes the page cache take
        # pages the machine has touched before, as it has on a long-running
        # node (a virtual machine's never-touched memory costs the first
        # write several times over).
        _fresh(path, size)
        _write(path, size, buffer, direct=False, drop=False)
        drop_from_page_cache(path)
        for way, direct, drop in (("write, buffered", False, False),
                                  ("write, buffered + drop", False, True),
                                  ("write, O_DIRECT", True, False)):
            _fresh(path, size)
            out[way] = _timed(partial(_write, path, size, buffer, direct, drop), size)
            drop_from_page_cache(path)
        _read(path, size, buffer, False)  # into the page cache
        out["read, page cache"] = _timed(lambda: _read(path, size, buffer, False), size)
        drop_from_page_cache(path)
        out["read, buffered from disk"] = _timed(lambda: _read(path, size, buffer, False), size)
        drop_from_page_cache(path)
        out["read, O_DIRECT"] = _timed(lambda: _read(path, size, buffer, True), size)
    finally:
        path.unlink(missing_ok=True)
        buffer.close()
    return out


def render(saved: dict[str, Any]) -> str:
    """The markdown section (BENCHMARKS.md)."""
    machine = saved.get("machine") or {}
    rounds: list[dict[str, Any]] = saved.get("rounds") or []
    lines = [
        "## Writing and reading cache blocks: what each way costs\n",
        f"`{saved.get('command', COMMAND)}` ({saved.get('measured_at', '?')}; "
        f"{machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores; "
        f"`{machine.get('uname_a') or machine.get('uname', '?')}`; file system "
        f"{saved.get('file_system', '?')}). {_num(saved.get('size', 0) / GiB)} GiB in 1 MiB "
        "pieces, the process's own CPU (user + system) per GiB; median (min-max) of "
        f"{len(rounds)} rounds. *buffered + drop* is the slab's way with "
        "`drop_written_pages` (sync_file_range and POSIX_FADV_DONTNEED per 8 MiB "
        "block); O_DIRECT moves the bytes between the device and the process's buffer "
        "without the page cache.\n",
        "| way | CPU-s/GiB | MB/s |",
        "|---|---|---|",
    ]
    for way in WAYS:
        cpu = [r[way]["cpu_s_per_gib"] for r in rounds if way in r]
        rate = [r[way]["mb_per_s"] for r in rounds if way in r]
        if cpu:
            lines.append(f"| {way} | {_spread(cpu, 3)} | {_spread(rate, 0)} |")
    return "\n".join(lines) + "\n"


def _num(value: float) -> str:
    return f"{value:g}"


def _spread(values: list[float], digits: int) -> str:
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:.{digits}f}"
    return f"{middle:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def _file_system(directory: Path) -> str:
    best, kind = "", "?"
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return kind
    target = str(directory.resolve())
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and (target == fields[1] or target.startswith(
                fields[1].rstrip("/") + "/")) and len(fields[1]) > len(best):
            best, kind = fields[1], fields[2]
    return kind


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.disk_io",
                                     description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, default=None,
                        help="where to write the test file (the cache disk); default: "
                             "the temp dir")
    parser.add_argument("--size", type=int, default=GiB, help="bytes per way (a multiple "
                        "of 8 MiB)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--record", action="store_true",
                        help="keep the rounds in bench/results/disk-io.json and .md")
    args = parser.parse_args(argv)
    if args.size <= 0 or args.size % BLOCK:
        parser.error("--size must be a positive multiple of 8 MiB")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    directory = args.dir or Path(tempfile.gettempdir())
    if not directory.is_dir():
        parser.error(f"--dir {directory}: not a directory")
    rounds = []
    for number in range(1, args.rounds + 1):
        try:
            measured = one_round(directory, args.size)
        except OSError as exc:
            parser.exit(1, f"python -m bench.disk_io: {directory}: {exc}\n")
        rounds.append(measured)
        print(json.dumps({"round": number, **measured}), flush=True)
    if args.record:
        saved = {
            "command": COMMAND, "size": args.size, "rounds": rounds,
            "file_system": _file_system(directory),
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "machine": machine_info(Path(__file__).resolve().parents[1]),
        }
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "disk-io.json").write_text(json.dumps(saved, indent=1) + "\n")
        (RESULTS / "disk-io.md").write_text(render(saved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
