"""`python -m tests.soak [--minutes N] [--seed S]`: see tests/soak/__init__.py."""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from sidecar.cache.slot_format import SLOT_HEADER_SIZE
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from tests.soak.chaos import Chaos, FlippingObject
from tests.soak.judge import growth
from tests.soak.load import Clients, Tally, Truth, range_reader, replay_reader, s3_client, writer
from tests.soak.rig import MiB, Sample, Supervisor, watch
from tests.soak.schedule import chaos_schedule
from tests.support.fault_proxy import FaultProxy
from tests.support.loop_disk import loop_disk

ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "reliability"
BUCKET = "soak"
BLOCK = MiB
SLOTS = 64
# 160 MiB holds the 64 MiB slab with room to spare, so that only the filler
# fills it; the data set (~90 MB) is larger than the cache, which keeps evicting.
DISK_BYTES = 160 * MiB
FLAGS = ("--block-size", "1MiB", "--cache-size", str(SLOTS * (BLOCK + SLOT_HEADER_SIZE)))
ENV = {
    "SIDECAR_PREALLOCATE": "false",  # a sparse slab: a full disk fails its writes
    "SIDECAR_DISK_RESERVE": "4MiB",  # the 1 GiB default is more than the whole disk
    "SIDECAR_DISK_CHECK_INTERVAL": "500ms",
    "SIDECAR_RECENT_CHUNKS": "8MiB",  # hits read the slab, not memory, most of the time
    "SIDECAR_MEMORY_TIER": "0",  # likewise: no chunk served from the memory tier
    "SIDECAR_HEAD_TTL": "5s",  # the rewritten objects are HEADed again often
    "SIDECAR_ORIGIN_DEADLINE": "3s",
    "SIDECAR_ORIGIN_CONNECT_TIMEOUT": "1s",
    # Room for read-ahead (16) and warm-up (4) besides foreground reads, and a
    # bound on the fault proxy's threads (one per connection).
    "SIDECAR_ORIGIN_MAX_CONNECTIONS": "24",
}
REPLAY_READERS, RANGE_READERS, SCRATCH_KEYS = 3, 2, 4
JOIN_S = 60.0
RSS_RATIO, RSS_SLACK, FD_RATIO, FD_SLACK = 1.25, 32 * MiB, 1.5, 16


def put_objects(origin_s3: Any, rng: random.Random
                ) -> tuple[dict[str, Truth], list[list[str]], list[FlippingObject]]:
    """Two partitions of four segments (Aiven's key layout, so that read-ahead
    crosses segments) and two objects with two versions each, of other sizes."""
    origin_s3.create_bucket(Bucket=BUCKET)
    truth: dict[str, Truth] = {}
    partitions: list[list[str]] = []
    topic_id = base64.urlsafe_b64encode(rng.randbytes(16)).rstrip(b"=").decode()
    for partition in range(2):
        keys = []
        offset = 0
        for _ in range(4):
            segment_id = base64.urlsafe_b64encode(rng.randbytes(16)).rstrip(b"=").decode()
            key = f"orders-{topic_id}/{partition}/{offset:020d}-{segment_id}.log"
            data = rng.randbytes(rng.randrange(7 * MiB, 11 * MiB))
            origin_s3.put_object(Bucket=BUCKET, Key=key, Body=data)
            truth[key] = (data,)
            keys.append(key)
            offset += len(data) // 1000
        partitions.append(keys)
    flipping = []
    for n in range(2):
        versions = (rng.randbytes(3 * MiB + 1000), rng.randbytes(3 * MiB + 200_000))
        flipping.append(FlippingObject(f"rewritten/{n}.bin", versions))
        origin_s3.put_object(Bucket=BUCKET, Key=f"rewritten/{n}.bin", Body=versions[0])
        truth[f"rewritten/{n}.bin"] = versions
    return truth, partitions, flipping


def peaks(samples: list[Sample], value: Callable[[Sample], int], duration_s: float,
          ratio: float, slack: int, unit: int) -> dict[str, Any]:
    series = [(s.at_s, value(s)) for s in samples]
    judged = growth(series, duration_s, ratio, slack)
    last_minute = [v for t, v in series if t >= duration_s - 60]
    return {
        "start": round(series[0][1] / unit, 1) if series else None,
        "end": round(series[-1][1] / unit, 1) if series else None,
        "peak": round(max(v for _, v in series) / unit, 1) if series else None,
        "last_minute_peak": round(max(last_minute) / unit, 1) if last_minute else None,
        "first_window_peak": round(judged.first_window_peak / unit, 1),
        "last_window_peak": round(judged.last_window_peak / unit, 1),
        "limit": round(judged.limit / unit, 1),
        "grew_without_bound": judged.grew,
    }


def final_state(supervisor: Supervisor) -> dict[str, Any]:
    """The last sidecar's own view after the EIO phase: its mode, its disk errors."""
    try:
        with urllib.request.urlopen(supervisor.admin_url + "/api/v1/stats",
                                    timeout=10) as response:
            stats = json.load(response)
        with urllib.request.urlopen(supervisor.admin_url + "/metrics", timeout=10) as response:
            families = text_string_to_metric_families(response.read().decode())
            disk_errors = sum(sample.value for family in families for sample in family.samples
                              if sample.name == "sidecar_cache_disk_errors_total")
        return {"mode": stats["mode"], "disk_problem": stats["disk_problem"],
                "checksum_failures": stats["cache"]["checksum_failures"],
                "disk_errors": int(disk_errors), "blocks": stats["cache"]["blocks"],
                "evictions": stats["cache"]["evictions"]}
    except (OSError, ValueError, KeyError) as exc:
        return {"error": repr(exc)}


def guarded(target: Callable[..., None], crashes: list[str], stop: threading.Event
            ) -> Callable[..., None]:
    """A soak thread that fails ends the run (and is reported) instead of
    leaving the rest to go on without it."""
    def run(*args: Any) -> None:
        try:
            target(*args)
        except Exception as exc:
            crashes.append(f"{target.__name__}: {exc!r}")
            stop.set()
            raise

    return run


def run(seed: int, minutes: float, command: str) -> dict[str, Any]:
    duration_s = minutes * 60
    rng = random.Random(seed)
    events = chaos_schedule(seed, duration_s)
    stop = threading.Event()
    samples: list[Sample] = []
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    log_path = ARTIFACTS / "soak-sidecar.log"
    log_path.write_text("")
    interrupted = False
    crashes: list[str] = []
    started_utc = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="soak-")))
        disk = stack.enter_context(loop_disk(workdir, DISK_BYTES))
        local_s3 = stack.enter_context(LocalS3())
        proxy = stack.enter_context(FaultProxy(local_s3.endpoint))
        origin_s3 = s3_client(local_s3.endpoint)
        stack.callback(origin_s3.close)
        truth, partitions, flipping = put_objects(origin_s3, rng)
        supervisor = Supervisor(proxy.endpoint, disk.mount, FLAGS, ENV, log_path)
        supervisor.start()
        started = time.monotonic()
        stack.callback(lambda: supervisor.stop(time.monotonic() - started))
        tally = Tally(started)
        clients = Clients(lambda: supervisor.data_url, BUCKET, truth, tally, stop)
        segments = [key for keys in partitions for key in keys]
        chaos = Chaos(supervisor, proxy, disk, origin_s3, BUCKET, segments, flipping,
                      BLOCK, SLOTS, random.Random(rng.random()), stop)
        targets: list[tuple[Callable[..., None], tuple[Any, ...]]] = [
            *[(replay_reader, (clients, partitions, random.Random(rng.random())))
              for _ in range(REPLAY_READERS)],
            *[(range_reader, (clients, sorted(truth), random.Random(rng.random())))
              for _ in range(RANGE_READERS)],
            (writer, (clients, SCRATCH_KEYS, random.Random(rng.random()))),
            (chaos.play, (events, started, duration_s)),
            (watch, (supervisor, started, stop, samples, duration_s + JOIN_S)),
        ]
        threads = [threading.Thread(target=guarded(target, crashes, stop), args=args,
                                    daemon=True, name=f"soak-{target.__name__}")
                   for target, args in targets]

        def stop_threads() -> None:
            # From here on the loop device must be let go of: a second Ctrl-C
            # (or SIGTERM) would leave it mounted.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            stop.set()
            proxy.clear()  # every stall ends now
            for thread in threads:
                thread.join(timeout=JOIN_S)

        stack.callback(stop_threads)
        for thread in threads:
            thread.start()
        try:
            stop.wait(duration_s)
        except KeyboardInterrupt:
            interrupted = True
        seconds = time.monotonic() - started
        at_end = final_state(supervisor)
        stop_threads()
        stuck = [thread.name for thread in threads if thread.is_alive()]
    return {
        "command": command, "seed": seed, "minutes": minutes,
        "started_utc": started_utc,
        "seconds": round(seconds, 1), "interrupted": interrupted,
        "objects": {"segments": len(segments), "rewritten": len(flipping),
                    "bytes": sum(len(v) for t in truth.values() for v in t if v is not None)},
        "requests": tally.requests, "bytes_verified": tally.bytes_verified,
        "wrong_bytes": tally.wrong_bytes, "wrong_answers": tally.wrong_answers,
        "answers": {k: tally.outcomes[k] for k in ("ok", "cut", "wrong", "wrong_status")},
        "errors_by_kind": dict(sorted(
            (k, n) for k, n in tally.outcomes.items()
            if k not in ("ok", "cut", "wrong", "wrong_status", "write ok"))),
        "writes_ok": tally.outcomes["write ok"],
        "events_injected": dict(sorted(chaos.injected.items())),
        "events_skipped": dict(sorted(chaos.skipped.items())),
        "origin_requests_hit_by_faults": dict(sorted(chaos.origin_requests_hit.items())),
        "warm_answers": dict(chaos.warm_answers),
        "mode_with_the_disk_full": dict(chaos.mode_with_disk_full),
        "restarts": supervisor.restarts,
        "unexpected_exits": supervisor.unexpected_exits,
        "rss_mib": peaks(samples, lambda s: s.rss, seconds, RSS_RATIO, RSS_SLACK, MiB),
        "fds": peaks(samples, lambda s: s.fds, seconds, FD_RATIO, FD_SLACK, 1),
        "growth_rule": "after a warm-up (1/6 of the run, at most 60 s), the peak of the last "
                       "window <= the peak of the first x 1.25 + 32 MiB (RSS), x 1.5 + 16 (fds); "
                       "windows of 1/4 of the run, at most 5 minutes",
        "at_end": at_end,
        "threads_left": stuck,
        "soak_errors": crashes,
        "event_log": [f"{at:.1f} s {name}" for at, name in chaos.log],
        "not_ok_per_10_s": {f"{step} s": dict(sorted(counts.items()))
                            for step, counts in sorted(tally.timeline.items())},
    }


def failures(summary: dict[str, Any]) -> list[str]:
    found = []
    if summary["wrong_bytes"] or summary["answers"]["wrong_status"]:
        found.append(f"{summary['wrong_bytes']} wrong bytes, "
                     f"{summary['answers']['wrong_status']} wrong statuses")
    if summary["unexpected_exits"]:
        found.append(f"{len(summary['unexpected_exits'])} unexpected exits")
    for measure in ("rss_mib", "fds"):
        if summary[measure]["grew_without_bound"]:
            found.append(f"{measure} grew without bound")
    if summary["soak_errors"]:
        found.append(f"the soak itself failed: {summary['soak_errors']}")
    if summary["threads_left"]:
        found.append(f"threads still running: {summary['threads_left']}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.soak", description=__doc__)
    parser.add_argument("--minutes", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=20261124)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the soak mounts a loop device: run it as root", file=sys.stderr)
        return 2
    missing = [tool for tool in ("mkfs.ext4", "losetup", "fallocate", "mount")
               if shutil.which(tool) is None]
    if missing:
        print(f"missing {missing}: run scripts/ensure-disk-tools.sh", file=sys.stderr)
        return 2
    os.environ.update(CREDENTIALS)

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM ends the run as Ctrl-C does: cleanly

    signal.signal(signal.SIGTERM, interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started ignoring it
    command = "python -m tests.soak " + " ".join(argv if argv is not None else sys.argv[1:])
    summary = run(args.seed, args.minutes, command.strip())
    summary["failures"] = failures(summary)
    text = json.dumps(summary, indent=1)
    (ARTIFACTS / "soak.json").write_text(text + "\n")
    print(text)
    return 1 if summary["failures"] else 130 if summary["interrupted"] else 0


if __name__ == "__main__":
    sys.exit(main())
