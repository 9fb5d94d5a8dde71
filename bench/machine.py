"""What the numbers were measured on."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.clients import wrk_version
from bench.nginx import nginx_version


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _run(args: list[str], cwd: Path | None = None) -> str | None:
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def _safe(function: Any) -> str | None:
    try:
        value: str = function()
        return value
    except (OSError, RuntimeError, subprocess.SubprocessError):
        return None


def machine_info(repo: Path) -> dict[str, Any]:
    ram = _ram_bytes()
    commit = _run(["git", "rev-parse", "HEAD"], repo)
    dirty = _run(["git", "status", "--porcelain", "--untracked-files=no"], repo)
    return {
        "uname": " ".join(platform.uname()),
        "uname_a": _run(["uname", "-a"]),
        "cpu_model": _cpu_model(),
        "cores": os.cpu_count(),
        "cpus_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "ram_bytes": ram,
        "ram_gib": round(ram / 2**30, 1) if ram else None,
        "python": sys.version.split()[0],
        "python_full": sys.version,
        "nginx": _safe(nginx_version),
        "wrk": _safe(wrk_version),
        "debian": _safe(lambda: Path("/etc/debian_version").read_text().strip()),
        "git_commit": commit,
        "git_dirty": bool(dirty) if dirty is not None else None,
    }
