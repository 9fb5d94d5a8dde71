"""A small tmpfs mounted for one test: a disk that really fills up."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def mounted_tmpfs(mount: Path, size: str) -> Iterator[Path]:
    """`mount` (created) holding a tmpfs of `size` (mount(8) -o size=, e.g. "1m"),
    unmounted after, lazily: a sidecar still holding a file there does not stop it."""
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)],
                   check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
