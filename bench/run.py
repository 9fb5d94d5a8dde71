"""`python -m bench [--quick] [--only NAME[,NAME]] [--report-only RESULTS.json ...]`.

Scenarios (in this order; each starts its own servers, with fresh caches):

  cold-1p      one partition, one stream, cold: origin direct, nginx slice
               cold, sidecar cold
  cold-4p      four partitions at once, cold: origin direct, nginx slice cold,
               nginx slice warm (the same replay again), sidecar cold
  warm-replay  the four-partition replay again against the sidecar of cold-4p
  warm-ranges  wrk: random 1 MiB ranges against that warm sidecar, against
               nginx serving the same files from local disk, and against two
               floor servers (bench/floor_server.py, aiohttp): from the page
               cache, and each chunk read with O_DIRECT and hashed first;
               each server's CPU per GiB from /proc
  isolation    a latency probe pinned to CPU 0 (1 ms sleeps, wake-up lateness)
               idle, then while the sidecar (--cpus 1), nginx and the replay
               (taskset -c 1) run a cold four-partition replay, and once with
               nothing pinned; then foreground miss latency through a sidecar
               with --origin-bandwidth, idle and while a big warm-up runs
  cost-4p      the light client (no CRC work), four partitions at once: the
               sidecar cold then warm, nginx slice cold then warm, the origin
               direct, with each server's CPU-seconds per GiB from /proc;
               several rounds (bench/cost.py)
  wide-48p     48 partitions x one 24 MiB segment at once, light client:
               sidecar cold vs nginx slice cold, fetch p99, first and last
               partition done, the sidecar's peak RSS
  warmup       warm the whole data set (the Spark job, else direct warm calls)
               into a fresh sidecar whose warm lane has a 160 MiB/s budget, then
               replay everything through it: warm-lane rate and hit ratio
  restart      restart after a kill -9 over 100k slots, 3 times (bench/recovery.py)
  broker       a real Kafka broker (tests/kafka, `make kafka`): consumers catch up on
               512 MiB tiered over 4 partitions (64 MiB with --quick) through its
               remote storage manager straight to the origin, with the manager's own
               disk chunk cache, through a cold and a warmed sidecar, and from the
               broker's local log; MB/s, CPU per GiB of the broker and the sidecar,
               origin traffic, the manager's request pattern (bench/broker.py)

warm-replay and warm-ranges reuse the sidecar cold-4p warmed; run alone (with
--only) they warm a fresh sidecar with one replay first, recorded as a warm-up.
isolation, warmup and broker start their own servers (bench/isolation.py,
bench/warmup.py, bench/broker.py).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench import cpu
from bench.broker import run_broker
from bench.clients import ClientFailed, replay_command, run_replay, run_wrk
from bench.cost import floor_server, run_cost_4p, run_wide
from bench.dataset import (
    FULL,
    QUICK,
    Dataset,
    DatasetSpec,
    ensure_dataset,
    write_listings,
    write_range_targets,
)
from bench.isolation import run_isolation
from bench.machine import machine_info
from bench.nginx import (
    FIRST_BYTE_S,
    ORIGIN_RATE,
    ORIGIN_SEND_CHUNK,
    SLICE,
    NginxServer,
    origin_config,
    origin_traffic,
    slice_cache_config,
)
from bench.report import console_summary, evaluate_targets, merge_results, render_markdown
from bench.sidecar_server import SidecarServer, stats_delta
from bench.signing import presigned_path
from bench.warmup import run_warmup

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
RESULTS = BENCH_DIR / "results"
DATA = BENCH_DIR / "data"
SCENARIOS = ("cold-1p", "cold-4p", "warm-replay", "warm-ranges", "cost-4p", "wide-48p",
             "isolation", "warmup", "restart", "broker")
RESULTS_VERSION = 1
# Floor servers (bench/floor_server.py) the warm ranges are also read from.
RANGE_FLOORS = ("aiohttp", "aiohttp-direct-verified")
RESTART_SLOTS = 100_000


@dataclass(frozen=True)
class Settings:
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


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
        """Record one run's result, or its failure, without stopping the others."""
        runs = self.scenarios.setdefault(scenario, {}).setdefault("runs", {})
        try:
            runs[run] = action()
        except (ClientFailed, RuntimeError, OSError, ValueError) as exc:
            runs[run] = None
            self.errors.append({"scenario": scenario, "run": run, "error": str(exc)[-4000:]})
            print(f"  {scenario}/{run} FAILED: {exc}", file=sys.stderr, flush=True)
            traceback.print_exc(file=sys.stderr)

    # --- scenarios -----------------------------------------------------------------

    def cold_one_partition(self) -> None:
        scenario = "cold-1p"
        partition = "0"
        self.scenarios[scenario] = {
            "partitions": partition, "concurrency": 1,
            "bytes": self.dataset.partition_bytes(0), "runs": {},
        }
        print(f"{scenario}: one partition, one stream, cold", file=sys.stderr, flush=True)

        def direct() -> dict[str, Any]:
            with self.origin("direct-1p") as origin:
                return self.replay("cold-1p-origin", origin.url, partition, 1, origin)

        def slice_cold() -> dict[str, Any]:
            with self.origin("slice-1p") as origin, self.slice_cache(origin) as cache:
                return self.replay("cold-1p-nginx-slice", cache.url, partition, 1, origin)

        def slice_lock_cold() -> dict[str, Any]:
            with self.origin("slice-lock-1p") as origin, \
                    self.slice_cache(origin, cache_lock=True) as cache:
                return self.replay("cold-1p-nginx-slice-lock", cache.url, partition, 1, origin)

        def sidecar_cold() -> dict[str, Any]:
            with self.origin("sidecar-1p") as origin, self.sidecar(origin) as sidecar:
                return self.replay("cold-1p-sidecar", sidecar.data_url, partition, 1, origin,
                                   sidecar)

        self.attempt(scenario, "origin", direct)
        self.attempt(scenario, "nginx_slice_cold", slice_cold)
        self.attempt(scenario, "nginx_slice_lock_cold", slice_lock_cold)
        self.attempt(scenario, "sidecar_cold", sidecar_cold)

    def four_partitions(self, selected: set[str]) -> None:
        concurrency = self.settings.concurrency_4p
        if "cold-4p" in selected:
            scenario = "cold-4p"
            self.scenarios[scenario] = {
                "partitions": "all", "concurrency": concurrency,
                "bytes": self.dataset.total_bytes, "runs": {},
            }
            print(f"{scenario}: {self.dataset.spec.partitions} partitions at once, cold",
                  file=sys.stderr, flush=True)

            def direct() -> dict[str, Any]:
                with self.origin("direct-4p") as origin:
                    return self.replay("cold-4p-origin", origin.url, "all", concurrency, origin)

            self.attempt(scenario, "origin", direct)
            with ExitStack() as stack:
                try:
                    origin = stack.enter_context(self.origin("slice-4p"))
                    cache = stack.enter_context(self.slice_cache(origin))
                except RuntimeError as exc:
                    self.errors.append({"scenario": scenario, "run": "nginx_slice",
                                        "error": str(exc)})
                else:
                    self.attempt(scenario, "nginx_slice_cold", lambda: self.replay(
                        "cold-4p-nginx-slice", cache.url, "all", concurrency, origin))
                    self.attempt(scenario, "nginx_slice_warm", lambda: self.replay(
                        "warm-4p-nginx-slice", cache.url, "all", concurrency, origin))

            def slice_lock_cold() -> dict[str, Any]:
                with self.origin("slice-lock-4p") as origin, \
                        self.slice_cache(origin, cache_lock=True) as cache:
                    return self.replay("cold-4p-nginx-slice-lock", cache.url, "all",
                                       concurrency, origin)

            self.attempt(scenario, "nginx_slice_lock_cold", slice_lock_cold)

        if not selected & {"cold-4p", "warm-replay", "warm-ranges"}:
            return
        with ExitStack() as stack:
            try:
                origin = stack.enter_context(self.origin("sidecar-4p"))
                sidecar = stack.enter_context(self.sidecar(origin))
            except RuntimeError as exc:
                self.errors.append({"scenario": "cold-4p", "run": "sidecar_cold",
                                    "error": str(exc)})
                return
            if "cold-4p" in selected:
                self.attempt("cold-4p", "sidecar_cold", lambda: self.replay(
                    "cold-4p-sidecar", sidecar.data_url, "all", concurrency, origin, sidecar))
            else:
                self.attempt("warm-up", "sidecar", lambda: self.replay(
                    "warm-up-sidecar", sidecar.data_url, "all", concurrency, origin, sidecar))
            if "warm-replay" in selected:
                self.scenarios.setdefault("warm-replay", {}).update({
                    "partitions": "all", "concurrency": concurrency,
                    "bytes": self.dataset.total_bytes})
                print("warm-replay: the same replay against the warm sidecar",
                      file=sys.stderr, flush=True)
                self.attempt("warm-replay", "sidecar_warm", lambda: self.replay(
                    "warm-4p-sidecar", sidecar.data_url, "all", concurrency, origin, sidecar))
            if "warm-ranges" in selected:
                self.warm_ranges(sidecar)

    def warm_ranges(self, sidecar: SidecarServer) -> None:
        scenario = "warm-ranges"
        settings = self.settings
        targets = self.work / "range-targets.txt"
        ranges = write_range_targets(self.dataset, targets, 1024 * 1024)
        # The sidecar's requests are signed, as the plugin's are (nginx ignores the query).
        signed_targets = self.work / "range-targets-signed.txt"
        write_range_targets(self.dataset, signed_targets, 1024 * 1024,
                            functools.partial(presigned_path, sidecar.data_url))
        self.scenarios[scenario] = {
            "tool": "wrk", "range_bytes": 1024 * 1024, "aligned_ranges": ranges,
            "connections": settings.wrk_connections, "threads": settings.wrk_threads,
            "seconds": settings.wrk_seconds, "runs": {},
        }
        print(f"{scenario}: wrk, random 1 MiB ranges, {settings.wrk_connections} connections, "
              f"{settings.wrk_seconds} s each", file=sys.stderr, flush=True)

        def wrk(url: str, label: str, server_pid: int | None,
                objects: Path = targets) -> dict[str, Any]:
            before = cpu.usage(server_pid) if server_pid else None
            result = run_wrk(url, objects, settings.wrk_seconds, settings.wrk_connections,
                             settings.wrk_threads, self.work / "logs" / f"{label}.log")
            if server_pid and before:
                # The server's CPU per GiB it sent: what a hit costs the node.
                delivered = (result["requests"] - result["errors"]["status"]) * result[
                    "range_bytes"]
                result["server_cpu_per_gib"] = (cpu.usage(server_pid) - before).per_gib(
                    delivered)
            print(f"  {label}: {result['requests_per_s']} req/s, {result['mb_per_s']} MB/s, "
                  f"p99 {result['latency_ms']['p99']} ms", file=sys.stderr, flush=True)
            return result

        def local() -> dict[str, Any]:
            with self.local_files() as server:
                return wrk(server.url, "warm-ranges-nginx-local", server.pid)

        def sidecar_warm() -> dict[str, Any]:
            before = sidecar.stats()
            result = wrk(sidecar.data_url, "warm-ranges-sidecar", sidecar.pid, signed_targets)
            result["sidecar"] = stats_delta(before, sidecar.stats())
            return result

        def floor(mode: str) -> dict[str, Any]:
            with floor_server(self, mode) as (endpoint, pid):
                return wrk(endpoint, f"warm-ranges-floor-{mode}", pid)

        self.attempt(scenario, "sidecar_warm", sidecar_warm)
        self.attempt(scenario, "nginx_local", local)
        # What any Python server pays for the same ranges: answering them from the
        # page cache and nothing else, and reading each chunk past the page cache
        # and hashing it first, as a cache that verifies every byte it serves.
        for mode in RANGE_FLOORS:
            self.attempt(scenario, f"floor_{mode}", functools.partial(floor, mode))


    def restart(self) -> None:
        """Restart after a kill -9 (bench/recovery.py), 100k slots, 3 times: how
        soon the store serves, and how long its scan of the slot headers takes."""
        scenario = "restart"
        self.scenarios[scenario] = {"slots": RESTART_SLOTS, "runs": {}}
        print(f"{scenario}: start over {RESTART_SLOTS:,} slots from a cold page cache, 3 times",
              file=sys.stderr, flush=True)

        def index() -> dict[str, Any]:
            runs = []
            for attempt in range(3):
                # A child process each time: a fresh interpreter, as at a real start.
                done = subprocess.run(
                    [sys.executable, "-m", "bench.recovery", "--slots", str(RESTART_SLOTS),
                     "--seed", str(attempt + 1)],
                    cwd=REPO, capture_output=True, text=True, timeout=600, check=True,
                )
                runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            seconds = sorted(run["seconds"] for run in runs)
            scanned = sorted(run["scan_seconds"] for run in runs)
            print(f"  ready in {seconds} s, headers scanned in {scanned} s", file=sys.stderr,
                  flush=True)
            return {"seconds": seconds, "median_seconds": seconds[1],
                    "scan_seconds": scanned, "median_scan_seconds": scanned[1],
                    "recovered": [run["recovered"] for run in runs],
                    "ok": all(run["ok"] for run in runs)}

        self.attempt(scenario, "index", index)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="256 MiB data set and 5 s wrk runs: checks the harness in minutes")
    parser.add_argument("--only", default=None, metavar="NAME[,NAME]",
                        help=f"run only these scenarios: {', '.join(SCENARIOS)}")
    parser.add_argument("--report-only", type=Path, nargs="+", default=None,
                        metavar="RESULTS.json",
                        help="regenerate BENCHMARKS.md from a results file and exit (its "
                             "targets read again from its scenarios); with more files, the "
                             "scenarios of each later one replace the earlier")
    parser.add_argument("--rounds", type=int, default=None, metavar="N",
                        help="rounds of cost-4p and wide-48p (default 3; 1 with --quick)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep bench/results/tmp/<run> (configs, logs) after the run")
    args = parser.parse_args(argv)
    if args.only:
        names = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = sorted(set(names) - set(SCENARIOS))
        if unknown:
            parser.error(f"--only: unknown scenario(s) {', '.join(unknown)}; "
                         f"known: {', '.join(SCENARIOS)}")
        args.only = names
    return args


def write_report(results: dict[str, Any], markdown: Path) -> None:
    markdown.write_text(render_markdown(results))


def _interrupt(signum: int, frame: object) -> None:
    # SIGTERM/SIGHUP unwind like Ctrl-C, so every server is stopped on the way out.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _interrupt)
    if args.report_only:
        base, *more = args.report_only
        merged: dict[str, Any] = json.loads(base.read_text())
        for path in more:
            merged = merge_results(merged, json.loads(path.read_text()), path.name)
        # Read again by the harness's current rules (and notes), from the scenarios.
        merged["targets"] = evaluate_targets(merged)
        write_report(merged, REPO / "BENCHMARKS.md")
        print(f"wrote {REPO / 'BENCHMARKS.md'} from {', '.join(map(str, args.report_only))}")
        return 0

    settings = QUICK_SETTINGS if args.quick else FULL_SETTINGS
    if args.rounds is not None:
        if args.rounds < 1:
            print("python -m bench: --rounds must be at least 1", file=sys.stderr)
            return 2
        settings = replace(settings, cost_rounds=args.rounds)
    selected = set(args.only or SCENARIOS)
    partial = bool(args.only) and set(args.only) != set(SCENARIOS)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    suffix = "-quick" if settings.quick else ("-partial" if partial else "")
    work = RESULTS / "tmp" / f"{stamp}{suffix}"
    work.mkdir(parents=True)
    (work / "logs").mkdir()
    started = time.monotonic()
    command = "make bench" if not settings.quick and not partial else (
        "python -m bench " + " ".join(argv if argv is not None else sys.argv[1:])).strip()

    print(f"bench: data set {settings.dataset.name} "
          f"({settings.dataset.nominal_bytes / 2**20:.0f} MiB) in {DATA}", file=sys.stderr)
    built_at = time.monotonic()
    dataset, built = ensure_dataset(settings.dataset, DATA)
    build_seconds = time.monotonic() - built_at
    print(f"bench: data set {'written' if built else 'reused'}: {len(dataset.objects)} segments, "
          f"{dataset.total_bytes / 2**20:.1f} MiB ({build_seconds:.1f} s)", file=sys.stderr)

    bench = Bench(settings, dataset, work)
    results: dict[str, Any] = {
        "version": RESULTS_VERSION,
        "started_at": _now(),
        "command": command,
        "quick": settings.quick,
        "scenarios_selected": [name for name in SCENARIOS if name in selected],
        "settings": asdict(settings),
        "machine": machine_info(REPO),
        "dataset": {
            "name": dataset.spec.name, "bucket": dataset.spec.bucket, "topic": dataset.spec.topic,
            "topic_id": dataset.topic_id, "partitions": dataset.spec.partitions,
            "segments_per_partition": dataset.spec.segments_per_partition,
            "segment_bytes": dataset.spec.segment_bytes, "value_size": dataset.spec.value_size,
            "objects": len(dataset.objects), "bytes": dataset.total_bytes,
            "built_this_run": built, "build_seconds": round(build_seconds, 2),
        },
        "origin_model": {
            "first_byte_ms": FIRST_BYTE_S * 1000, "limit_rate": ORIGIN_RATE,
            "sendfile_max_chunk": ORIGIN_SEND_CHUNK,
        },
        "baselines": {"nginx_slice": SLICE},
    }
    try:
        if "cold-1p" in selected:
            bench.cold_one_partition()
        bench.four_partitions(selected)
        if "cost-4p" in selected:
            run_cost_4p(bench)
        if "wide-48p" in selected:
            run_wide(bench)
        if "isolation" in selected:
            run_isolation(bench)
        if "warmup" in selected:
            run_warmup(bench)
        if "restart" in selected:
            bench.restart()
        if "broker" in selected:
            run_broker(bench)
    except KeyboardInterrupt:
        bench.errors.append({"scenario": "*", "run": "*", "error": "interrupted"})
        print("bench: interrupted; writing what was measured", file=sys.stderr)
    finally:
        results["scenarios"] = bench.scenarios
        results["errors"] = bench.errors
        results["finished_at"] = _now()
        results["seconds"] = round(time.monotonic() - started, 1)
        results["targets"] = evaluate_targets(results)

        RESULTS.mkdir(parents=True, exist_ok=True)
        out = RESULTS / f"{stamp}{suffix}.json"
        out.write_text(json.dumps(results, indent=2) + "\n")
        print(f"bench: results in {out}", file=sys.stderr)
        if suffix:
            markdown = RESULTS / f"{stamp}{suffix}.md"
        else:
            (RESULTS / "latest.json").write_text(json.dumps(results, indent=2) + "\n")
            markdown = REPO / "BENCHMARKS.md"
        write_report(results, markdown)
        print(f"bench: report in {markdown}", file=sys.stderr)
        print(console_summary(results))
        if bench.errors or args.keep_work:
            print(f"bench: configs and logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 1 if bench.errors else 0
