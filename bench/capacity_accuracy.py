"""How well the capacity curve predicts cache sizes it was not measured at, over a grid.

    python -m bench.capacity_accuracy [--streams 1,4,16,48] [--patterns one-group,...]
                                      [--shares 0.1,0.25,0.5,1] [--rounds 3] [--out DIR]
                                      [--again DIR]

(also `python -m bench --only capacity-accuracy`, and `make bench`, which run
the whole grid). The cells are bench/capacity_grid.py's: streams x patterns x
cache shares of the working set. Each (streams, pattern) is served by a real
sidecar in front of moto at every share, its consumers reading at once, one
thread and one connection each, as Kafka's remote readers do; then the curve
built from the REFERENCE_SHARE run's access log (the replay of
`python -m spark_warmup.capacity`, run here without Spark) predicts every
share, set beside what each run's own counters measured
(sidecar_served_bytes_total, sidecar_origin_bytes_total). Each share is served
`--rounds` times by a fresh sidecar: the same cell served twice differs by
points of byte hit ratio (concurrent readers and a shared machine interleave
differently), so the prediction is set beside the mean of the rounds, and the
table shows their spread. The prediction comes from the first round's log at
the reference share, as an operator has one log; the curve of every round's
reference log is replayed too, and their mean and spread shown beside it: the
replay's own error, with one run's luck averaged out, and how far the curve
moves from one log of the same workload to another.
Results: bench/results/capacity-accuracy.json and capacity-accuracy.md (spliced
into BENCHMARKS.md). The runs' access logs are kept (the run names the
directory); `--again DIR` judges them again by the replay as it is now, in
seconds, without serving: the way to try a change of the replay.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from statistics import fmean
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

from bench.capacity_grid import (
    BLOCK,
    HIT_POINTS,
    ORIGIN_SHARE,
    PATTERNS,
    REFERENCE_SHARE,
    SEGMENTS_PER_PARTITION,
    SHARES,
    STREAMS,
    Reader,
    cache_bytes,
    judged,
    readers,
    segment_bytes,
    working_set_blocks,
    worst,
)
from bench.machine import machine_info
from bench.stopping import unwind_on_signals
from sidecar.tools.kafka_segments import generate_topic_segments
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from spark_warmup.capacity.__main__ import replay_settings
from spark_warmup.capacity.accuracy import TABLE as TRUST_TABLE
from spark_warmup.capacity.local import replay_log
from spark_warmup.capacity.simulate import Settings
from spark_warmup.capacity.trace import Fetch, Request, parse_line
from tests.support.processes import SidecarProcess

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
BUCKET = "capacity-grid"
NODE = "grid"
# Rounds per cell in the benchmark: with three, the mean's spread is about a
# point of byte hit ratio where one run's was up to five (bench/ANALYSIS.md).
ROUNDS = 3


@dataclass(frozen=True)
class Measured:
    cache_bytes: int
    log: Path
    served_cache: float
    served_origin: float
    origin_bytes: float

    @property
    def served(self) -> float:
        return self.served_cache + self.served_origin

    @property
    def byte_hit_ratio(self) -> float:
        return self.served_cache / self.served if self.served else 0.0

    @property
    def origin_per_served(self) -> float:
        return self.origin_bytes / self.served if self.served else 0.0


def sidecar_config(path: Path) -> Path:
    """The configuration every run shares and the replay follows: 64 KiB blocks
    and a read-ahead window of four, as for a cache of a few hundred blocks."""
    path.write_text(f'cache_dir = "{path.parent / "unused"}"\n'
                    f'block_size = "{BLOCK // 1024}KiB"\n'
                    'prefetch_max_window = "256KiB"\n')
    return path


class Progress:
    """Fetches done per group, and the starts waiting on them."""

    def __init__(self, consumers: Sequence[Reader]) -> None:
        self._totals: dict[str, int] = {}
        for reader in consumers:
            self._totals[reader.group] = self._totals.get(reader.group, 0) + len(reader.fetches)
        self._done = dict.fromkeys(self._totals, 0)
        self._changed = threading.Condition()

    def one_done(self, group: str) -> None:
        with self._changed:
            self._done[group] += 1
            self._changed.notify_all()

    def wait_for(self, group: str, share: float) -> None:
        with self._changed:
            self._changed.wait_for(
                lambda: self._done[group] >= share * self._totals[group], timeout=600)


def consume(data_url: str, bucket: str, reader: Reader, progress: Progress,
            failures: list[str]) -> None:
    if reader.after is not None:
        progress.wait_for(reader.after, reader.at)
    where = urllib.parse.urlsplit(data_url)
    connection = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port,
                                            timeout=60)
    try:
        for key, first, last in reader.fetches:
            connection.request("GET", f"/{bucket}/{key}",
                               headers={"Range": f"bytes={first}-{last}"})
            response = connection.getresponse()
            body = response.read()
            if response.status != 206 or len(body) != last - first + 1:
                failures.append(f"{reader.name}: {key} {first}-{last}: {response.status}")
            progress.one_done(reader.group)
    except OSError as exc:
        failures.append(f"{reader.name}: {exc}")
    finally:
        connection.close()


def serve(endpoint: str, consumers: Sequence[Reader], size: int, config: Path,
          work: Path, bucket: str = BUCKET) -> Measured:
    """One run: a fresh sidecar of `size`, every consumer reading at once."""
    cache = work / "cache"
    cache.mkdir(parents=True)
    log = work / "access.log"
    progress = Progress(consumers)
    failures: list[str] = []
    with SidecarProcess(endpoint, cache, "--config", str(config), "--cache-size", str(size),
                        "--access-log", str(log), env={"SIDECAR_NODE_NAME": NODE}) as sidecar:
        threads = [threading.Thread(target=consume, args=(sidecar.data_url, bucket, reader,
                                                          progress, failures))
                   for reader in consumers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        sidecar.wait_idle(timeout=60)
        measured = Measured(
            size, log, sidecar.metric("sidecar_served_bytes_total", source="cache"),
            sidecar.metric("sidecar_served_bytes_total", source="origin"),
            sidecar.metric("sidecar_origin_bytes_total"))
    if failures:
        raise RuntimeError(f"{len(failures)} fetches failed, first: {failures[0]}")
    return measured


def _measured(runs: Sequence[Measured]) -> dict[str, float]:
    """The rounds of one cell: the means the prediction is judged against, and
    how far apart the rounds were."""
    hits = [run.byte_hit_ratio for run in runs]
    origins = [run.origin_per_served for run in runs]
    return {"measured_byte_hit_ratio": fmean(hits),
            "measured_origin_per_served": fmean(origins),
            "measured_hit_spread": max(hits) - min(hits),
            "measured_origin_spread": max(origins) - min(origins)}


def _predicted(hits: Sequence[float]) -> dict[str, float]:
    """The predictions of one cell from each round's reference log: their mean
    (judged against the measured mean as the replay's own error) and spread."""
    return {"predicted_byte_hit_ratio_rounds": fmean(hits),
            "predicted_hit_spread": max(hits) - min(hits)}


def run_cell(endpoint: str, s3: Any, streams: int, pattern: str, shares: Sequence[float],
             work: Path, bucket: str = BUCKET, rounds: int = 1) -> list[dict[str, Any]]:
    """Every share of one (streams, pattern): measured `rounds` times, and
    predicted from the first round's log at the reference share."""
    topic = f"grid{streams}"
    segments = list(generate_topic_segments(
        topic=topic, partitions=streams, segments_per_partition=SEGMENTS_PER_PARTITION,
        segment_bytes=segment_bytes(streams), value_size=1024, seed=34))
    for segment in segments:
        s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
    blocks = working_set_blocks(segments)
    consumers = readers(pattern, segments)
    work.mkdir(parents=True, exist_ok=True)
    config = sidecar_config(work / "sidecar.toml")
    wanted = sorted(set(shares) | {REFERENCE_SHARE})
    sizes = {share: cache_bytes(share, blocks) for share in wanted}
    measured: dict[float, list[Measured]] = {share: [] for share in wanted}
    for number in range(rounds):
        for share in wanted:
            started = time.monotonic()
            measured[share].append(serve(endpoint, consumers, sizes[share], config,
                                         work / run_name(pattern, streams, share, number),
                                         bucket))
            print(f"capacity-accuracy: {streams} streams, {pattern}, {share:.0%}, round "
                  f"{number + 1}: {time.monotonic() - started:.1f} s", file=sys.stderr)
    return judged_cell(streams, pattern, shares, blocks, sum(len(r.fetches) for r in consumers),
                       measured, replay_settings(config))


def run_name(pattern: str, streams: int, share: float, number: int) -> str:
    """The directory of one run under its cell's (access.log, cache/)."""
    return f"{pattern}-{streams}-{share}-{number}"


def judged_cell(streams: int, pattern: str, shares: Sequence[float], blocks: int,
                requests: int, measured: dict[float, list[Measured]],
                settings: Settings) -> list[dict[str, Any]]:
    """The rows of one (streams, pattern): each share's rounds set beside the
    curve replayed from the first round's log at the reference share (and
    the curves of the other rounds' logs)."""
    sizes = {share: runs[0].cache_bytes for share, runs in measured.items()}
    curves = [replay_log(run.log, settings, list(sizes.values()))
              for run in measured[REFERENCE_SHARE]]
    predicted = curves[0]
    rows = []
    for share in shares:
        outcome = predicted[sizes[share]]
        rounds_predicted = _predicted([curve[sizes[share]].byte_hit_ratio for curve in curves])
        measured_figures = _measured(measured[share])
        rows.append(judged({
            "streams": streams, "pattern": pattern, "share": share,
            "cache_bytes": sizes[share], "cache_blocks": sizes[share] // (BLOCK + 4096),
            "working_set_blocks": blocks, "requests": requests,
            "rounds": len(measured[share]), **measured_figures, **rounds_predicted,
            "hit_error_rounds": rounds_predicted["predicted_byte_hit_ratio_rounds"]
            - measured_figures["measured_byte_hit_ratio"],
            "predicted_byte_hit_ratio": outcome.byte_hit_ratio,
            "predicted_origin_per_served": outcome.origin_per_served,
            "predicted_read_ahead_wasted_per_served": outcome.wasted_per_served,
        }))
    return rows


def measured_from_log(log: Path) -> Measured:
    """A run's figures from its access log alone (each read's bytes from blocks
    found cached or joined, every line's origin bytes): what the sidecar's
    counters said, which the log accounts for line by line
    (tests/functional/test_capacity.py)."""
    served = hits = origin = size = 0
    with log.open(encoding="utf-8") as lines:
        for parsed in map(parse_line, lines):
            if isinstance(parsed, Request):
                served += parsed.bytes
                hits += parsed.hits()[0]
                origin += parsed.origin_bytes or 0
                size = parsed.cache_bytes or size
            elif isinstance(parsed, Fetch):
                origin += parsed.origin_bytes
    return Measured(size, log, hits, served - hits, origin)


def rejudge(work: Path, streams: Sequence[int], patterns: Sequence[str],
            shares: Sequence[float]) -> list[dict[str, Any]]:
    """A former run's cells judged again by today's replay, from the access
    logs it kept (its work directory, named at its end): minutes of serving
    not made again to try a change of the replay."""
    rows: list[dict[str, Any]] = []
    for count in streams:
        cell = work / f"s{count}"
        for pattern in patterns:
            wanted = sorted(set(shares) | {REFERENCE_SHARE})
            measured: dict[float, list[Measured]] = {}
            for share in wanted:
                logs = sorted(cell.glob(f"{pattern}-{count}-{share}-*/access.log"),
                              key=lambda log: int(log.parent.name.rsplit("-", 1)[1]))
                measured[share] = [measured_from_log(log) for log in logs]
            if not all(measured.values()):
                continue
            with measured[REFERENCE_SHARE][0].log.open(encoding="utf-8") as lines:
                reads = [p for p in map(parse_line, lines) if isinstance(p, Request)]
            objects = {read.key: read.object_size for read in reads}
            blocks = sum(-(-size // BLOCK) for size in objects.values())
            requests = len(reads)
            rows += judged_cell(count, pattern, shares, blocks, requests, measured,
                                replay_settings(cell / "sidecar.toml"))
    return rows


def run_grid(streams: Sequence[int], patterns: Sequence[str], shares: Sequence[float],
             out: Path, rounds: int = ROUNDS) -> dict[str, Any]:
    os.environ.update(CREDENTIALS)
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="capacity-accuracy-"))
    rows: list[dict[str, Any]] = []
    with LocalS3() as local_s3:
        s3 = boto3.client("s3", endpoint_url=local_s3.endpoint, region_name="us-east-1",
                          config=BotoConfig(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket=BUCKET)
        for count in streams:
            for pattern in patterns:
                rows += run_cell(local_s3.endpoint, s3, count, pattern, shares,
                                 work / f"s{count}", rounds=rounds)
    full = (tuple(streams), tuple(patterns), tuple(shares)) == (STREAMS, PATTERNS, SHARES)
    document = {
        "command": "python -m bench.capacity_accuracy" + ("" if full else (
            f" --streams {','.join(map(str, streams))} --patterns {','.join(patterns)} "
            f"--shares {','.join(map(str, shares))}"))
        + ("" if rounds == ROUNDS else f" --rounds {rounds}"),
        "rounds": rounds,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
        "seconds": round(time.monotonic() - started, 1),
        "machine": machine_info(ROOT), "block_size": BLOCK, "full_grid": full,
        "reference_share": REFERENCE_SHARE, "rows": rows, "worst": worst(rows),
    }
    out.mkdir(parents=True, exist_ok=True)
    print(f"capacity-accuracy: the runs' access logs are kept in {work} (--again {work} "
          "judges them again)", file=sys.stderr)
    (out / "capacity-accuracy.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "capacity-accuracy.md").write_text(render(document))
    if out == RESULTS:
        write_trust_table(document)
    return document


def write_trust_table(document: dict[str, Any]) -> None:
    """The errors per cell the capacity report quotes for each node
    (spark_warmup/capacity/accuracy.py)."""
    cells = [{key: row[key] for key in ("streams", "pattern", "share", "hit_error",
                                        "origin_error", "measured_hit_spread",
                                        "predicted_hit_spread") if key in row}
             for row in document["rows"]]
    TRUST_TABLE.write_text(json.dumps({"command": document["command"],
                                       "date": document["date"], "cells": cells},
                                      indent=1) + "\n")


def run_capacity_accuracy(bench: Any) -> None:
    """`python -m bench`'s step (bench/run.py): the whole grid, its table written
    beside the results as a fragment of BENCHMARKS.md."""
    def grid() -> dict[str, Any]:
        document = run_grid(STREAMS, PATTERNS, SHARES, RESULTS)
        bad = document["worst"] or {}
        return {"kind": "capacity-accuracy", "cells": len(document["rows"]),
                "within": sum(1 for row in document["rows"] if row["within"]),
                "worst": f"{bad.get('streams')} streams, {bad.get('pattern')}, "
                         f"{bad.get('share', 0):.0%}: {100 * bad.get('hit_error', 0):+.1f} "
                         f"points, {100 * bad.get('origin_error', 0):+.1f}% origin",
                "results": "bench/results/capacity-accuracy.json"}
    bench.attempt("capacity-accuracy", "grid", grid)


def render(document: dict[str, Any]) -> str:
    machine = document["machine"]
    rows = document["rows"]
    within = sum(1 for row in rows if row["within"])
    rounds = document.get("rounds", 1)
    spreads = sorted(row.get("measured_hit_spread", 0.0) for row in rows)
    moves = sorted(row.get("predicted_hit_spread", 0.0) for row in rows)
    replay_within = sum(1 for row in rows if abs(row.get("hit_error_rounds", 1.0)) <= HIT_POINTS
                        and abs(row["origin_error"]) <= ORIGIN_SHARE)
    lines = [
        "## Capacity curve accuracy\n",
        f"`{document['command']}`, {document['date']} (UTC), {document['seconds']:.0f} s, on "
        f"{machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores"
        + ("" if document["full_grid"] else " (a subset of the grid; `make bench` runs all "
           "of it)") + ". Each (streams, pattern) is served by a real sidecar in front of "
        "moto at each cache size (a share of the working set; 64 KiB blocks, a 256 KiB "
        "read-ahead window), its consumers reading at once, "
        f"{rounds} round{'s' if rounds != 1 else ''} each; the predictions all come from "
        f"the curve built from the first {document['reference_share']:.0%} run's access log; "
        "the measured figures are the mean of the rounds' own counters "
        "(sidecar_served_bytes_total, sidecar_origin_bytes_total"
        + ("; here read again from the access logs the runs kept, which account for them "
           "line by line" if document.get("again") else "") + "), the spread the largest "
        "less the smallest byte hit ratio of a cell's rounds (median "
        f"{100 * spreads[len(spreads) // 2] if spreads else 0:.1f} points, largest "
        f"{100 * spreads[-1] if spreads else 0:.1f}). Target: within "
        f"{HIT_POINTS * 100:.0f} points of byte hit ratio and {ORIGIN_SHARE:.0%} of origin "
        f"bytes per served byte. **{within} of {len(rows)} cells within.** The curve of each "
        "round's reference log, replayed too, moves the prediction of a cell by "
        f"{100 * moves[len(moves) // 2] if moves else 0:.1f} points (median; largest "
        f"{100 * moves[-1] if moves else 0:.1f}): one log's luck; their mean, set beside the "
        f"measured mean, is within 2 points on {replay_within} of {len(rows)} cells (the "
        "replay's own error, that luck averaged out).\n",
        "| streams | pattern | cache | byte hit measured | spread (points) | predicted "
        "| error (points) | predicted, mean of the rounds' logs (spread) | its error "
        "| origin/served measured | predicted | error | read-ahead waste predicted |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        mark = "" if row["within"] else " **out**"
        lines.append(
            f"| {row['streams']} | {row['pattern']} | {row['share']:.0%} "
            f"({row['cache_blocks']} of {row['working_set_blocks']} blocks) | "
            f"{row['measured_byte_hit_ratio']:.3f} | "
            f"{100 * row.get('measured_hit_spread', 0.0):.1f} | "
            f"{row['predicted_byte_hit_ratio']:.3f} | "
            f"{100 * row['hit_error']:+.1f} | "
            f"{row.get('predicted_byte_hit_ratio_rounds', row['predicted_byte_hit_ratio']):.3f} "
            f"({100 * row.get('predicted_hit_spread', 0.0):.1f}) | "
            f"{100 * row.get('hit_error_rounds', row['hit_error']):+.1f} | "
            f"{row['measured_origin_per_served']:.3f} | "
            f"{row['predicted_origin_per_served']:.3f} | {100 * row['origin_error']:+.1f}%"
            f"{mark} | {row['predicted_read_ahead_wasted_per_served']:.3f} |")
    bad = document.get("worst")
    if bad:
        lines.append(
            f"\nWorst cell: {bad['streams']} streams, {bad['pattern']}, cache "
            f"{bad['share']:.0%}: byte hit {100 * bad['hit_error']:+.1f} points, origin bytes "
            f"per served byte {100 * bad['origin_error']:+.1f}%.")
    return "\n".join(lines) + "\n"


def _list(text: str, kind: type) -> list[Any]:
    return [kind(item) for item in text.split(",") if item.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.capacity_accuracy")
    parser.add_argument("--streams", default=",".join(map(str, STREAMS)))
    parser.add_argument("--patterns", default=",".join(PATTERNS))
    parser.add_argument("--shares", default=",".join(map(str, SHARES)))
    parser.add_argument("--rounds", type=int, default=ROUNDS,
                        help="runs of each cell, the prediction judged against their mean")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--again", type=Path, metavar="DIR",
                        help="serve nothing: judge a former run's kept access logs (the "
                             "directory its end names) by the replay as it is now, and print "
                             "the table; nothing is written")
    args = parser.parse_args(argv)
    unwind_on_signals()
    streams, patterns = _list(args.streams, int), _list(args.patterns, str)
    shares = _list(args.shares, float)
    unknown = sorted(set(patterns) - set(PATTERNS))
    if unknown or not streams or not shares or min(streams) < 1 or args.rounds < 1:
        parser.error(f"--patterns: known {', '.join(PATTERNS)}; --streams and --shares: "
                     "positive lists; --rounds: 1 or more")
    if args.again is not None:
        if not args.again.is_dir():
            parser.error(f"--again {args.again}: no such directory")
        started = time.monotonic()
        rows = rejudge(args.again, streams, patterns, shares)
        if not rows:
            parser.error(f"--again {args.again}: no cell's access logs under it (s<streams>/"
                         "<pattern>-<streams>-<share>-<round>/access.log)")
        print(render({
            "command": f"python -m bench.capacity_accuracy --again {args.again}",
            "rounds": max(row["rounds"] for row in rows),
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
            "seconds": time.monotonic() - started, "machine": machine_info(ROOT),
            "full_grid": len(rows) == len(STREAMS) * len(PATTERNS) * len(SHARES),
            "reference_share": REFERENCE_SHARE, "rows": rows, "worst": worst(rows),
            "again": True}))
        return 0
    document = run_grid(streams, patterns, shares, args.out, args.rounds)
    print(render(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
