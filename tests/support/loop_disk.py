"""A cache disk that can really fail: an ext4 file system on a loop device over
a file, which a test cuts short to make its reads fail with EIO, as a dying
device's do (the cache-disk fault tests and the chaos soak)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.support.installs import ensure


def ensure_disk_tools() -> None:
    """mkfs.ext4, losetup, fallocate and mount, from Debian when missing."""
    ensure("ensure-disk-tools.sh")


@dataclass(frozen=True)
class LoopDisk:
    mount: Path
    backing: Path
    device: str


@contextmanager
def loop_disk(workdir: Path, size: int) -> Iterator[LoopDisk]:
    """An ext4 file system on its own loop device over a `size` file; always
    unmounted and detached, whatever happened to it (EIO included)."""
    backing, mount = workdir / "cache-disk.img", workdir / "cache"
    mount.mkdir()
    with open(backing, "wb") as image:
        image.truncate(size)
    device = subprocess.run(["losetup", "--find", "--show", str(backing)], check=True,
                            capture_output=True, text=True).stdout.strip()
    try:
        subprocess.run(["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0",
                        device], check=True)
        subprocess.run(["mount", device, str(mount)], check=True)
        try:
            yield LoopDisk(mount, backing, device)
        finally:
            # A failed disk may refuse a clean unmount; a lazy one always goes,
            # and the device is freed when the last file on it is closed.
            if subprocess.run(["umount", str(mount)], check=False).returncode != 0:
                subprocess.run(["umount", "-l", str(mount)], check=True)
    finally:
        subprocess.run(["losetup", "-d", device], check=False)


def drop_pages(path: Path) -> None:
    """Push a file's dirty pages to the disk and drop them from the page cache:
    the next reads go to the device."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@contextmanager
def frozen(mount: Path) -> Iterator[None]:
    """The file system at `mount` frozen (fsfreeze(8), the FIFREEZE ioctl LVM
    snapshots use): every write to it, a file's creation included, waits in the
    kernel in D state, uninterruptible, as on a device whose requests never come
    back, until it is thawed, which this always does."""
    subprocess.run(["fsfreeze", "--freeze", str(mount)], check=True)
    try:
        yield
    finally:
        subprocess.run(["fsfreeze", "--unfreeze", str(mount)], check=True)
