"""The load generators: the broker-like replay client and wrk.

Both run as child processes in their own process group, bounded in time, and
are killed (with everything they started) if they overrun.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.sidecar_server import client_env

BENCH_DIR = Path(__file__).resolve().parent
WRK_SCRIPT = BENCH_DIR / "random_ranges.lua"
RANGE_BYTES = 1024 * 1024


class ClientFailed(RuntimeError):
    pass


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: str
    stderr: str
    seconds: float


def run_bounded(
    args: list[str], timeout_s: float, env: dict[str, str], log: Path | None = None
) -> Finished:
    """Run to completion or kill the whole process group after `timeout_s`."""
    started = time.monotonic()
    process = subprocess.Popen(
        args, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=env, text=True, start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill_group(process.pid)
        stdout, stderr = process.communicate(timeout=30)
        raise ClientFailed(
            f"{' '.join(args[:4])}... did not finish within {timeout_s:.0f} s: {stderr[-2000:]}"
        ) from None
    finally:
        if process.poll() is None:
            _kill_group(process.pid)
            process.wait(timeout=30)
    if log is not None:
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text(f"$ {' '.join(args)}\n--- stdout\n{stdout}\n--- stderr\n{stderr}\n")
    return Finished(process.returncode, stdout, stderr, time.monotonic() - started)


def _kill_group(pgid: int) -> None:
    for signum in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.2)


def replay_command(
    endpoint: str, bucket: str, topic: str, partitions: str, concurrency: int,
    admin: str | None = None, list_endpoint: str | None = None, fetch_bytes: str = "1MiB",
) -> list[str]:
    args = [
        sys.executable, "-m", "sidecar", "replay", "--endpoint", endpoint, "--bucket", bucket,
        "--topic", topic, "--partitions", partitions, "--concurrency", str(concurrency),
        "--fetch-bytes", fetch_bytes, "--json",
    ]
    if admin:
        args += ["--admin", admin]
    if list_endpoint:
        args += ["--list-endpoint", list_endpoint]
    return args


def run_replay(args: list[str], timeout_s: float, log: Path) -> dict[str, Any]:
    """One replay; its JSON report (the last JSON object line on stdout)."""
    finished = run_bounded(args, timeout_s, client_env(), log)
    report: dict[str, Any] | None = None
    for line in reversed(finished.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                report = json.loads(line)
                break
            except ValueError:
                continue
    if report is None:
        raise ClientFailed(
            f"replay exited {finished.returncode} without a JSON report: "
            f"{finished.stderr.strip()[-2000:] or finished.stdout.strip()[-2000:]}"
        )
    report["exit_code"] = finished.returncode
    report["wall_seconds"] = round(finished.seconds, 3)
    return report


def wrk_binary() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise RuntimeError("wrk is not installed: run `bash bench/install-deps.sh`")
    return found


def wrk_version() -> str:
    result = subprocess.run([wrk_binary(), "-v"], capture_output=True, text=True, timeout=10)
    text = (result.stdout + result.stderr).strip()
    # "wrk debian/4.1.0-3+b2 [epoll] Copyright (C) 2012 Will Glozer" -> up to "[epoll]"
    return text.splitlines()[0].split(" Copyright")[0].strip() if text else "unknown"


def run_wrk(
    url: str, targets: Path, seconds: int, connections: int, threads: int, log: Path,
    range_bytes: int = RANGE_BYTES,
) -> dict[str, Any]:
    """Random aligned `range_bytes` GETs over the objects listed in `targets`."""
    env = {**client_env(), "BENCH_RANGE_OBJECTS": str(targets),
           "BENCH_RANGE_BYTES": str(range_bytes)}
    args = [
        wrk_binary(), "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s",
        "--timeout", "10s", "--latency", "-s", str(WRK_SCRIPT), url,
    ]
    finished = run_bounded(args, seconds + 60, env, log)
    marker = [line for line in finished.stdout.splitlines() if line.startswith("BENCH_JSON ")]
    if finished.returncode != 0 or not marker:
        raise ClientFailed(f"wrk exited {finished.returncode}: {finished.stderr[-2000:]}"
                           f"{finished.stdout[-2000:]}")
    raw = json.loads(marker[-1].removeprefix("BENCH_JSON "))
    duration_s = raw["duration_us"] / 1e6
    errors = raw["errors"]
    ok = raw["requests"] - errors["status"]
    latency = raw["latency_us"]
    return {
        "url": url, "connections": connections, "threads": threads, "seconds": duration_s,
        "range_bytes": range_bytes,
        "requests": raw["requests"], "errors": errors,
        "requests_per_s": round(raw["requests"] / duration_s, 2) if duration_s else None,
        # Body bytes of the successful 206s; wrk's own byte count includes headers.
        "mb_per_s": round(ok * range_bytes / 1e6 / duration_s, 2) if duration_s else None,
        "wire_mb_per_s": round(raw["bytes"] / 1e6 / duration_s, 2) if duration_s else None,
        "latency_ms": {
            name: round(latency[name] / 1000, 3) for name in ("p50", "p90", "p99", "max", "mean")
        },
        "summary": _wrk_summary(finished.stdout),
    }


def _wrk_summary(stdout: str) -> str:
    """wrk's own human-readable output, without the script's JSON line."""
    return "\n".join(
        line for line in stdout.splitlines() if not line.startswith("BENCH_JSON ")
    ).strip()


def parse_wrk_latency_distribution(stdout: str) -> dict[str, str]:
    """The `--latency` table (50%/75%/90%/99%) as wrk prints it, for the record."""
    return dict(re.findall(r"^\s+(\d+%)\s+(\S+)\s*$", stdout, flags=re.MULTILINE))


def head(url: str, path: str, timeout_s: float = 60.0) -> tuple[int, dict[str, str]]:
    """`HEAD path` at the server of `url`: the status and the answer's header
    fields (lower-case names)."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port,
                                            timeout=timeout_s)
    try:
        connection.request("HEAD", path)
        response = connection.getresponse()
        response.read()
        return response.status, {name.lower(): value for name, value in response.getheaders()}
    finally:
        connection.close()
