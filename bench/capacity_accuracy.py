"""How well the capacity curve predicts a cache size it was not measured at.

    python -m bench.capacity_accuracy

The workload, sizes and sidecar settings of tests/functional/test_capacity.py
(a consumer group reading every partition, a second group replaying an
overlapping range later, a lagging consumer catching up), served by real
sidecars in front of moto at each cache size in turn; then
`python -m spark_warmup.capacity` on the first (smallest) run's access log
predicts every size, set beside what each run's own counters measured.
Results go to bench/results/capacity-accuracy.json and capacity-accuracy.md.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config as BotoConfig

from bench.machine import machine_info
from sidecar.tools.kafka_segments import generate_topic_segments
from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from tests.functional.test_capacity import (
    BLOCK,
    SEGMENT_BYTES,
    run_capacity,
    serve,
    sidecar_config,
    workload,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SIZES_BLOCKS = (24, 40, 64, 112, 160)


def main() -> int:
    os.environ.update(CREDENTIALS)
    work = Path(tempfile.mkdtemp(prefix="capacity-accuracy-"))
    sizes = [blocks * (BLOCK + 4096) for blocks in SIZES_BLOCKS]
    with LocalS3() as local_s3:
        s3 = boto3.client("s3", endpoint_url=local_s3.endpoint, region_name="us-east-1",
                          config=BotoConfig(s3={"addressing_style": "path"}))
        s3.create_bucket(Bucket="capacity-accuracy")
        segments = list(generate_topic_segments(
            topic="orders", partitions=3, segments_per_partition=3,
            segment_bytes=SEGMENT_BYTES, value_size=1024, seed=18))
        for segment in segments:
            s3.put_object(Bucket="capacity-accuracy", Key=segment.key, Body=segment.data)
        fetches = workload(segments)
        config = sidecar_config(work / "sidecar.toml")
        measured = [serve(local_s3, "capacity-accuracy", fetches, size, config,
                          work / f"run-{size}") for size in sizes]
    report = work / "report"
    result = run_capacity("--logs", str(measured[0].log), "--report", str(report),
                          "--master", "local[2]", "--sizes", ",".join(map(str, sizes)),
                          "--sidecar-config", str(config), "--conf", "spark.ui.enabled=false")
    if result.returncode != 0:
        print(result.stderr[-4000:], file=sys.stderr)
        return 1
    summary = json.loads((report / "summary.json").read_text())
    curve = {p["cache_bytes"]: p for p in next(iter(summary["nodes"].values()))["curve"]}
    rows: list[dict[str, Any]] = []
    for size, blocks, run in zip(sizes, SIZES_BLOCKS, measured, strict=True):
        served = run.served_cache + run.served_origin
        predicted = curve[size]
        rows.append({
            "cache_bytes": size, "blocks": blocks,
            "measured_byte_hit_ratio": run.byte_hit_ratio,
            "predicted_byte_hit_ratio": predicted["byte_hit_ratio"],
            "measured_origin_bytes": int(run.origin_bytes),
            "predicted_origin_bytes": int(predicted["origin_bytes_per_served_byte"] * served),
        })
    document = {"command": "python -m bench.capacity_accuracy",
                "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M"),
                "machine": machine_info(ROOT), "requests": len(fetches),
                "block_size": BLOCK, "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "capacity-accuracy.json").write_text(json.dumps(document, indent=1) + "\n")
    (RESULTS / "capacity-accuracy.md").write_text(render(document))
    print(render(document))
    return 0


def render(document: dict[str, Any]) -> str:
    machine = document["machine"]
    lines = [
        "## Capacity curve accuracy\n",
        f"`{document['command']}`, {document['date']} (UTC), on "
        f"{machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores. The workload of "
        "tests/functional/test_capacity.py "
        f"({document['requests']} fetches: a consumer group reading three partitions, a "
        "second group re-reading an overlapping range later, a lagging consumer catching "
        "up; 64 KiB blocks, a 256 KiB read-ahead window) served by a real sidecar in front "
        "of moto at each cache size. The predictions all come from the curve built from "
        f"the first ({document['rows'][0]['blocks']}-block) run's access log; the measured "
        "figures are each run's own counters (sidecar_served_bytes_total, "
        "sidecar_origin_bytes_total).\n",
        "| cache | measured byte hit ratio | predicted | measured origin bytes | predicted "
        "| origin error |",
        "|---|---|---|---|---|---|",
    ]
    for row in document["rows"]:
        error = row["predicted_origin_bytes"] / row["measured_origin_bytes"] - 1
        lines.append(
            f"| {row['blocks']} blocks ({row['cache_bytes'] / 1024 ** 2:.1f} MiB) | "
            f"{row['measured_byte_hit_ratio']:.4f} | {row['predicted_byte_hit_ratio']:.4f} | "
            f"{row['measured_origin_bytes']:,} | {row['predicted_origin_bytes']:,} | "
            f"{100 * error:+.1f}% |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
