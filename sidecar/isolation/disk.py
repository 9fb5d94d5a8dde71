"""The cache's dedicated disk: which device it is, and watching its free space.

A cache on the broker's own log disk would compete with live produce and fetch
I/O, so start-up refuses a cache dir on the device of a protected path (the
broker's log.dirs) unless told otherwise.

The watcher checks statvfs every few seconds: below the reserve it asks the
store to give space back (shrink), above it (with hysteresis) to grow again;
after a failed write (ENOSPC, EIO) the disk counts as failed (the sidecar
bypasses the cache) until a probe write succeeds and space is above the reserve.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import errno
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

PROBE_NAME = ".disk-probe"
PROBE_BYTES = 64 * 1024
# The longest a failed disk stays bypassed before it is probed again, and how
# soon after a recovery (in holds) a new failure doubles the hold.
MAX_HOLD_S = 600.0
REPEAT_WITHIN = 10


@dataclass(frozen=True)
class DeviceInfo:
    device: str  # major:minor
    source: str  # what is mounted there, e.g. /dev/nvme1n1
    mount_point: str


def device_of(path: Path) -> DeviceInfo:
    st_dev = os.stat(path).st_dev
    numbers = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    try:
        # Bytes as the kernel wrote them, decoded as the file system names
        # paths (os.fsdecode), so a mount point that is not UTF-8 still
        # compares with the resolved path.
        with open("/proc/self/mountinfo", "rb") as mountinfo:
            text = os.fsdecode(mountinfo.read())
    except OSError:
        return DeviceInfo(numbers, "?", "?")
    return mount_of(text, numbers, str(path.resolve()))


def mount_of(mountinfo: str, numbers: str, path: str) -> DeviceInfo:
    """The mount of device `numbers` (major:minor) that holds `path` (absolute,
    resolved), read from /proc/self/mountinfo's text: the longest mount point
    that is `path` or one of its ancestors; "?" when none is."""
    best = DeviceInfo(numbers, "?", "?")
    for line in mountinfo.splitlines():
        # proc(5): ID parent major:minor root mount-point options [optional...] - fstype source ...
        fields = line.split(" ")
        if len(fields) <= 4 or fields[2] != numbers or "-" not in fields[5:]:
            continue
        separator = fields.index("-", 5)
        if separator + 2 >= len(fields):
            continue
        mount_point = _unescaped(fields[4])
        source = _unescaped(fields[separator + 2])
        longer = best.mount_point == "?" or len(mount_point) > len(best.mount_point)
        if longer and _within(path, mount_point):
            best = DeviceInfo(numbers, source, mount_point)
    return best


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")


def _unescaped(field: str) -> str:
    """A mountinfo field as the path it names: the kernel writes a space, tab,
    newline and backslash in it as a backslash and three octal digits (\\040,
    \\011, \\012, \\134; seq_file's mangle_path), so the line splits on spaces."""
    return _OCTAL_ESCAPE.sub(lambda match: chr(int(match.group(1), 8)), field)


def _within(path: str, mount_point: str) -> bool:
    """Whether `path` is `mount_point` or below it: whole path components, so
    /data holds /data/cache but not /data2/cache."""
    if mount_point == "/":
        return path.startswith("/")
    return path == mount_point or path.startswith(mount_point.rstrip("/") + "/")


def check_dedicated(cache_dir: Path, protect: tuple[Path, ...], allow_shared: bool) -> DeviceInfo:
    cache_device = device_of(cache_dir)
    for path in protect:
        try:
            other = device_of(path)
        except OSError as exc:
            raise ConfigError(f"--protect-path {path}: {exc.strerror}") from None
        if other.device == cache_device.device:
            if allow_shared:
                log.warning("cache dir %s shares device %s with %s (allowed)",
                            cache_dir, cache_device.device, path)
                continue
            raise ConfigError(
                f"--cache-dir {cache_dir} is on the same device ({cache_device.device} "
                f"{cache_device.source}) as --protect-path {path}; give the cache its own disk "
                "or pass --allow-shared-disk"
            )
    return cache_device


def free_bytes(directory: Path) -> int:
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def probe_write(directory: Path) -> None:
    """Write, sync, read back from the disk and remove a small file: raises
    OSError while the disk is unwell (a disk failing reads fails the read)."""
    path = directory / PROBE_NAME
    pattern = os.urandom(PROBE_BYTES)
    try:
        with open(path, "w+b") as probe:
            probe.write(pattern)
            probe.flush()
            os.fsync(probe.fileno())
            # Out of the page cache, so that the read below asks the disk.
            os.posix_fadvise(probe.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
            if os.pread(probe.fileno(), PROBE_BYTES, 0) != pattern:
                raise OSError(errno.EIO, "the disk gave back other bytes than were written")
    finally:
        path.unlink(missing_ok=True)


class DiskWatcher:
    def __init__(
        self,
        directory: Path,
        reserve_bytes: int,
        interval_s: float,
        executor: concurrent.futures.Executor,
        *,
        shrink: Callable[[int], int],
        grow: Callable[[], int],
        failed: Callable[[], bool],
        recovered: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._directory = directory
        self._reserve = reserve_bytes
        self._interval = interval_s
        self._executor = executor
        self._shrink = shrink
        self._grow = grow
        self._failed = failed
        self._recovered = recovered
        self._clock = clock
        # A disk that fails again soon after it was seen well (a failing device
        # whose bad areas a small probe misses) stays bypassed longer each time,
        # up to MAX_HOLD_S, rather than flapping every few seconds.
        self._hold = interval_s
        self._failed_at: float | None = None
        self._recovered_at: float | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.check(loop)
            except Exception:  # the watcher must outlive any one bad check
                log.exception("disk check of %s failed", self._directory)

    async def check(self, loop: asyncio.AbstractEventLoop) -> None:
        free = await loop.run_in_executor(self._executor, free_bytes, self._directory)
        if free < self._reserve:
            released = self._shrink(self._reserve - free)
            if released:
                log.warning("cache disk has %d bytes free (reserve %d): gave back %d bytes",
                            free, self._reserve, released)
        elif free > self._reserve * 3 // 2:
            self._grow()
        if not self._failed():
            return
        now = self._clock()
        if self._failed_at is None:
            self._failed_at = now
            again_soon = self._recovered_at is not None and \
                now - self._recovered_at < REPEAT_WITHIN * self._hold
            self._hold = min(MAX_HOLD_S, self._hold * 2) if again_soon else self._interval
        if free < self._reserve or now - self._failed_at < self._hold:
            return
        try:
            await loop.run_in_executor(self._executor, probe_write, self._directory)
        except OSError as exc:
            log.info("cache disk still unwell: %s", exc)
            return
        self._failed_at = None
        self._recovered_at = now
        self._recovered()
