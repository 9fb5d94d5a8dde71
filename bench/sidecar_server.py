"""The sidecar under test, as `python -m sidecar serve` in its own process group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

#: Any credentials do: the benchmark origin does not check signatures.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "bench",
    "AWS_SECRET_ACCESS_KEY": "bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def client_env() -> dict[str, str]:
    """The environment of every child: dummy credentials, no profile or proxy."""
    env = {
        name: value for name, value in os.environ.items()
        if not name.startswith("AWS_") and name.lower() not in ("http_proxy", "https_proxy")
    }
    env.update(CREDENTIALS)
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    return env


class SidecarServer:
    """Started with a fresh cache directory; `data_url`/`admin_url` once ready."""

    def __init__(
        self, origin_url: str, cache_dir: Path, log_dir: Path, cache_size: str = "2GiB",
        extra: tuple[str, ...] = (), env: Mapping[str, str] | None = None,
    ) -> None:
        self.args = [
            sys.executable, "-m", "sidecar", "serve",
            "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0",
            "--origin-endpoint", origin_url, "--cache-dir", str(cache_dir),
            "--cache-size", cache_size, *extra,
        ]
        self.cache_dir = cache_dir
        self.log_dir = log_dir
        self.extra_env = dict(env or {})
        self.data_url = ""
        self.admin_url = ""
        self.admin_token = ""
        self._process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> SidecarServer:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / "sidecar.stdout"

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / "sidecar.stderr"

    def start(self) -> None:
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        # Every benchmark client signs with CREDENTIALS (presigned paths,
        # bench/signing.py, or an SDK), as a broker's plugin signs.
        env = {**client_env(), "SIDECAR_LOG_LEVEL": "WARNING", **self.extra_env}
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self._process = subprocess.Popen(
                self.args, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready = self._ready_line()
            if ready is not None:
                self.data_url, self.admin_url = ready["data"], ready["admin"]
                # Generated at the first start into the cache dir (mode 0600).
                self.admin_token = Path(ready["admin_token_file"]).read_text().strip()
                self._await_memory_tier(deadline)
                return
            if self._process.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(
            "the sidecar did not start: " + self.stderr_path.read_text(errors="replace")[-4000:]
        )

    def _await_memory_tier(self, deadline: float) -> None:
        """Until the memory tier's pages are taken (memory_tier_reserve, in the
        background from the start), as on a sidecar that has run for a while:
        a replay then pays for its copies, not for the start's reserve."""
        while time.monotonic() < deadline:
            size = self.metric_samples("sidecar_memory_tier_size_bytes") or {}
            resident = self.metric_samples("sidecar_memory_tier_resident_bytes") or {}
            if sum(resident.values()) >= sum(size.values()):
                return
            time.sleep(0.05)

    def _ready_line(self) -> dict[str, Any] | None:
        for line in self.stdout_path.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and event.get("event") == "ready":
                return event
        return None

    def stop(self) -> int | None:
        process, self._process = self._process, None
        if process is None:
            return None
        if process.poll() is None:
            _signal_group(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(process.pid, signal.SIGKILL)
        if process.poll() is None:
            process.wait(timeout=STOP_TIMEOUT_S)
        return process.returncode

    def stats(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.admin_url + "/api/v1/stats", timeout=10) as response:
            result: dict[str, Any] = json.load(response)
            return result

    def metric_samples(self, name: str) -> dict[str, float] | None:
        """{label values joined by ',': value} of one metric family; None when absent."""
        try:
            with urllib.request.urlopen(self.admin_url + "/metrics", timeout=10) as response:
                text = response.read().decode()
        except (urllib.error.URLError, OSError):
            return None
        found: dict[str, float] | None = None
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name:
                    found = found or {}
                    found[",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))] = (
                        sample.value
                    )
        return found

    def lane_samples(self, name: str = "sidecar_origin_bytes_total") -> dict[str, float]:
        """{lane: value} of a metric labelled by lane only (0 for lanes not yet seen);
        {} when /metrics did not answer or has no such metric."""
        found = self.metric_samples(name)
        if found is None:
            return {}
        lanes = {"foreground": 0.0, "prefetch": 0.0, "warm": 0.0}
        for labels, value in found.items():
            if labels.startswith("lane=") and "," not in labels:
                lanes[labels.removeprefix("lane=")] = value
        return lanes

    def warm(
        self, objects: list[dict[str, Any]], ttl_s: float, timeout_s: float
    ) -> dict[str, Any]:
        """`POST /api/v1/warm`; the sidecar answers when every block is warmed."""
        body = json.dumps({"objects": objects, "ttl_s": ttl_s}).encode()
        request = urllib.request.Request(
            self.admin_url + "/api/v1/warm", data=body, method="POST",
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {self.admin_token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                answer: dict[str, Any] = json.load(response)
                return answer
        except urllib.error.HTTPError as exc:
            with exc:
                text = exc.read().decode(errors="replace")
            raise RuntimeError(f"POST /api/v1/warm answered {exc.code}: {text[:500]}") from None

    def can_list(self, bucket: str) -> bool:
        """Whether the data port answers ListObjectsV2 (pass-through to the origin)."""
        url = f"{self.data_url}/{bucket}?list-type=2&prefix="
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.status == 200 and b"ListBucketResult" in response.read()
        except (urllib.error.URLError, OSError):
            return False


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except (ProcessLookupError, PermissionError):
        pass


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The sidecar's counters over one replay (the stats are since start-up)."""
    def count(stats: dict[str, Any], *path: str) -> int:
        value: Any = stats
        for name in path:
            if not isinstance(value, dict) or name not in value:
                return 0
            value = value[name]
        return int(value or 0)

    def delta(*path: str) -> int:
        return count(after, *path) - count(before, *path)

    hits, misses = delta("hits"), delta("misses")
    cache, origin = delta("served_bytes", "cache"), delta("served_bytes", "origin")
    result: dict[str, Any] = {
        "hits": hits, "misses": misses,
        "block_hit_ratio": hits / (hits + misses) if hits + misses else None,
        "served_bytes": {"cache": cache, "origin": origin},
        "byte_hit_ratio": cache / (cache + origin) if cache + origin else None,
        "origin_bytes": delta("origin_bytes"),
    }
    if isinstance(after.get("prefetch"), dict):
        result["prefetch"] = {
            name: delta("prefetch", name) for name in ("issued", "used", "wasted")
        }
    result["cache_after"] = after.get("cache")
    return result
