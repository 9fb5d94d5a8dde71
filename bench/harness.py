"""The harness every scenario runs on: one run's servers, clients and results.

`Bench` starts the origin emulator (bench/nginx.py), nginx's slice cache, the
sidecar and the floor servers in fresh work directories, runs the replay
client against them, and records each run's result, or its failure, under its
scenario. The scenarios (bench/cold_1p.py, bench/four_partitions.py, ...)
are written against it; bench/run.py picks them and writes the results.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.clients import ClientFailed, replay_command, run_replay
from bench.dataset import FULL, QUICK, Dataset, DatasetSpec, write_listings
from bench.floor_server import ready_port
from bench.nginx import NginxServer, origin_config, origin_traffic, slice_cache_config
from bench.sidecar_server import SidecarServer, client_env, stats_delta

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
DATA = BENCH_DIR / "data"


@dataclass(frozen=True)
class Settings:
    """What a run measures with (the results keep them under "settings")."""

    quick: bool
    dataset: DatasetSpec
    wrk_seconds: int
    wrk_connections: int = 8
    wrk_threads: int = 2
    sidecar_cache_size: str = "2GiB"
    concurrency_4p: int = 4
    # isolation: the probe's CPU and the one everything else is pinned to
    probe_cpu: int = 0
    load_cpu: int = 1
    probe_idle_seconds: float = 8.0
    miss_samples: int = 20  # foreground misses idle, and as many under warm-up
    miss_bandwidth: str = "200MiB/s"  # --origin-bandwidth of the miss-latency sidecar
    # warmup: the warm lane's budget is bandwidth x share
    warmup_bandwidth: str = "200MiB/s"
    warmup_share: float = 0.8
    warmup_concurrency: int = 6  # SIDECAR_WARM_CONCURRENCY (origin connections)
    warmup_calls: int = 4  # warm calls in flight (the Spark plan's `concurrency`)
    warmup_cache_size: str = "4GiB"  # warmed blocks are protected within half the cache
    # cost-4p and wide-48p (bench/cost.py): rounds of each, fresh servers every round
    cost_rounds: int = 3
    # broker (bench/broker.py): bytes in remote storage over its 4 partitions, segment size
    broker_remote_bytes: int = 512 * 1024 * 1024
    broker_segment_bytes: int = 64 * 1024 * 1024


FULL_SETTINGS = Settings(quick=False, dataset=FULL, wrk_seconds=20)
QUICK_SETTINGS = Settings(quick=True, dataset=QUICK, wrk_seconds=5, probe_idle_seconds=4.0,
                          miss_samples=8, cost_rounds=1,
                          broker_remote_bytes=64 * 1024 * 1024,
                          broker_segment_bytes=8 * 1024 * 1024)


def _replay_timeout(bytes_: int) -> float:
    # Generous: a replay slower than 2 MB/s is broken, not slow.
    return 120.0 + bytes_ / 2e6


class Bench:
    """One benchmark run: servers, clients, and the raw results they produce."""

    def __init__(self, settings: Settings, dataset: Dataset, work: Path) -> None:
        self.settings = settings
        self.dataset = dataset
        self.data_dir = DATA
        self.work = work
        self.listings = work / "listings"
        self.by_raw_prefix = write_listings(dataset, self.listings)
        self.scenarios: dict[str, dict[str, Any]] = {}
        self.errors: list[dict[str, str]] = []
        self._counter = 0

    # --- servers -------------------------------------------------------------------

    def workdir(self, name: str) -> Path:
        self._counter += 1
        path = self.work / f"{self._counter:02d}-{name}"
        path.mkdir(parents=True)
        return path

    def origin(self, name: str, cpus: str | None = None) -> NginxServer:
        prefix = self.workdir(f"origin-{name}")
        return NginxServer(
            f"origin ({name})", prefix,
            lambda port: origin_config(prefix, port, self.dataset.root, self.listings,
                                       self.by_raw_prefix),
            cpus=cpus,
        )

    def local_files(self) -> NginxServer:
        prefix = self.workdir("nginx-local")
        return NginxServer(
            "local files", prefix,
            lambda port: origin_config(
                prefix, port, self.dataset.root, self.listings, self.by_raw_prefix,
                first_byte_s=None, rate=None, workers="auto", access_log=False,
            ),
        )

    @contextmanager
    def slice_cache(self, origin: NginxServer, cache_lock: bool = False) -> Iterator[NginxServer]:
        prefix = self.workdir("nginx-slice-lock" if cache_lock else "nginx-slice")
        cache = prefix / "cache"
        server = NginxServer(
            "slice cache", prefix,
            lambda port: slice_cache_config(prefix, port, origin.url, cache,
                                            cache_lock=cache_lock),
        )
        with server:
            yield server
        shutil.rmtree(cache, ignore_errors=True)

    @contextmanager
    def sidecar(
        self, origin: NginxServer, extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None, cache_size: str | None = None,
    ) -> Iterator[SidecarServer]:
        prefix = self.workdir("sidecar")
        cache = prefix / "cache"
        server = SidecarServer(origin.url, cache, prefix,
                               cache_size or self.settings.sidecar_cache_size, extra, env)
        with server:
            yield server
        shutil.rmtree(cache, ignore_errors=True)

    @contextmanager
    def floor_server(self, mode: str) -> Iterator[tuple[str, int]]:
        """A `bench.floor_server` over the data set's files: (endpoint, pid)."""
        log = self.work / "logs" / f"floor-{mode}.stderr"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as errors:
            process = subprocess.Popen(
                [sys.executable, "-m", "bench.floor_server", "--root", str(self.dataset.root),
                 "--mode", mode], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=errors, env=client_env(), text=True)
        try:
            port = ready_port(process)
            if port is None:
                raise ClientFailed(f"floor server {mode} did not start: "
                                   f"{log.read_text(errors='replace')[-2000:]}")
            yield f"http://127.0.0.1:{port}", process.pid
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)

    # --- clients -------------------------------------------------------------------

    def replay(
        self, label: str, endpoint: str, partitions: str, concurrency: int,
        origin: NginxServer, sidecar: SidecarServer | None = None, *,
        cpus: str | None = None, list_via_origin: bool = False,
    ) -> dict[str, Any]:
        """One replay, with what the origin sent meanwhile (and the sidecar's counters).

        `cpus`: run the replay client under `taskset -c cpus`; `list_via_origin`:
        list segments at the origin even when the sidecar could list.
        """
        list_endpoint = origin.url if list_via_origin else None
        if sidecar is not None and list_endpoint is None and \
                not sidecar.can_list(self.dataset.spec.bucket):
            # The broker never lists (segment metadata comes from a Kafka topic);
            # a sidecar without List pass-through is read through, listed beside.
            list_endpoint = origin.url
        args = replay_command(
            endpoint, self.dataset.spec.bucket, self.dataset.spec.topic, partitions, concurrency,
            admin=sidecar.admin_url if sidecar else None, list_endpoint=list_endpoint,
        )
        wanted = (self.dataset.total_bytes if partitions == "all" else sum(
            self.dataset.partition_bytes(int(p)) for p in partitions.split(",")))
        _, offset = origin_traffic(origin.access_log)
        before = sidecar.stats() if sidecar else None
        print(f"  {label}: replaying {wanted / 2**20:.0f} MiB from {endpoint} ...",
              file=sys.stderr, flush=True)
        pinned = ["taskset", "-c", cpus, *args] if cpus else args
        report = run_replay(pinned, _replay_timeout(wanted), self.work / "logs" / f"{label}.log")
        time.sleep(0.2)  # let nginx write the access-log lines of closed connections
        traffic, _ = origin_traffic(origin.access_log, offset)
        report["command"] = " ".join([*(["taskset", "-c", cpus] if cpus else []), "python",
                                      *args[1:]])
        report["origin_traffic"] = asdict(traffic)
        report["origin_body_bytes_per_replayed_byte"] = (
            traffic.body_bytes / report["bytes"] if report.get("bytes") else None
        )
        report["listed_via"] = "origin" if list_endpoint else "endpoint"
        if sidecar is not None and before is not None:
            report["sidecar"] = stats_delta(before, sidecar.stats())
            report["sidecar_prefetch_blocks_total"] = sidecar.metric_samples(
                "sidecar_prefetch_blocks_total")
        print(f"  {label}: {report.get('mb_per_s')} MB/s, fetch p99 "
              f"{(report.get('fetch_latency_ms') or {}).get('p99')} ms", file=sys.stderr,
              flush=True)
        return report

    def attempt(self, scenario: str, run: str, action: Callable[[], dict[str, Any]]) -> None:
        """Record one run's result, or its failure, without stopping the others.

        Any failure: a client's report without a figure the scenario reads
        (KeyError, TypeError) fails this run, not the rest of the benchmark."""
        runs = self.scenarios.setdefault(scenario, {}).setdefault("runs", {})
        try:
            runs[run] = action()
        except Exception as exc:
            runs[run] = None
            self.failed(scenario, run, exc)

    def failed(self, scenario: str, run: str, exc: Exception) -> None:
        """Record a failure, shown in the report's failures and the console."""
        self.errors.append({"scenario": scenario, "run": run, "error": failure_text(exc)})
        print(f"  {scenario}/{run} FAILED: {failure_text(exc)}", file=sys.stderr, flush=True)
        traceback.print_exc(file=sys.stderr)


def failure_text(exc: Exception) -> str:
    """What the results keep of a failure: the message of the benchmark's own
    errors, and the kind of any other (a bare KeyError says only its key)."""
    expected = (ClientFailed, RuntimeError, OSError, ValueError)
    text = str(exc) if isinstance(exc, expected) else f"{type(exc).__name__}: {exc}"
    return text[-4000:]
