"""What ships to executors (the zip), the header peek, and the demo's example plan."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from sidecar.tools.commands import program, python_module
from sidecar.tools.kafka_segments import build_segment, iter_segment_batches
from sidecar.tools.warmup_example import example_instructions, example_plan
from spark_warmup.capacity.shipping import CAPACITY
from spark_warmup.listing import BATCH_HEADER_SIZE, batch_times
from spark_warmup.plan import parse_plan
from spark_warmup.shipping import WARMUP, ZIP_NAME, build_zip


def test_batch_times_read_a_genuine_header() -> None:
    data, _ = build_segment(500, target_bytes=200_000, records_per_batch=20, value_size=100,
                            base_timestamp_ms=1_790_000_000_500, seed=3, timestamp_step_ms=1)
    first = next(iter_segment_batches(data))
    assert batch_times(data[:BATCH_HEADER_SIZE]) == (first.base_timestamp, first.max_timestamp)
    assert first.base_timestamp == 1_790_000_000_500


def test_batch_times_refuses_what_is_not_a_v2_header() -> None:
    data, _ = build_segment(0, target_bytes=10_000, records_per_batch=5, value_size=10,
                            base_timestamp_ms=0, seed=1, timestamp_step_ms=1)
    with pytest.raises(ValueError, match="61 bytes"):
        batch_times(data[:60])
    legacy = bytearray(data[:BATCH_HEADER_SIZE])
    legacy[16] = 1
    with pytest.raises(ValueError, match="magic 1"):
        batch_times(bytes(legacy))


def test_the_zip_runs_without_the_project_or_site_packages(tmp_path: Path) -> None:
    path = build_zip(tmp_path)
    assert path.name == ZIP_NAME
    names = set(zipfile.ZipFile(path).namelist())
    assert {"sidecar/__init__.py", "sidecar/layout.py", "sidecar/blocks.py",
            "sidecar/bucket_names.py", "spark_warmup/__init__.py", "spark_warmup/listing.py",
            "spark_warmup/warming.py"} <= names
    assert not any(name.startswith("sidecar/") and name not in
                   ("sidecar/__init__.py", "sidecar/layout.py", "sidecar/blocks.py",
                    "sidecar/bucket_names.py")
                   for name in names)
    # -I -S: no project directory, no site-packages, only the zip: the executor
    # side (listing, warming, selection, routing) imports from it alone.
    script = (
        f"import sys; sys.path.insert(0, {str(path)!r}); "
        "import spark_warmup.listing, spark_warmup.warming, spark_warmup.selection, "
        "spark_warmup.routing, sidecar.layout; "
        "print(spark_warmup.listing.__file__); print(sorted(m for m in sys.modules "
        "if m.startswith('sidecar')))"
    )
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True,
                            text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    where, modules = result.stdout.splitlines()
    assert where.startswith(str(path))
    assert modules == "['sidecar', 'sidecar.blocks', 'sidecar.bucket_names', 'sidecar.layout']"


def test_the_capacity_zip_replays_without_the_project_or_site_packages(tmp_path: Path) -> None:
    """The executors of the capacity analysis replay reads through the store's
    policy and the planner from the zip alone (no xxhash, no aiohttp there)."""
    path = build_zip(tmp_path, CAPACITY)
    names = set(zipfile.ZipFile(path).namelist())
    assert {"sidecar/__init__.py", "sidecar/cache/__init__.py", "sidecar/prefetch/__init__.py",
            "sidecar/cache/slot_fifo.py", "spark_warmup/capacity/simulate.py"} <= names
    script = (
        f"import sys; sys.path.insert(0, {str(path)!r}); "
        "from spark_warmup.capacity.simulate import Read, Settings, replay; "
        "reads = [Read(float(t), 'b', 'orders-x/0/%020d-s.log' % 0, 'e', 4 << 20, "
        "(t % 4) << 20, 1 << 20, True) for t in range(8)]; "
        "print(replay(Settings(block_size=1 << 20), 8 << 20, reads).hit_blocks)"
    )
    result = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True,
                            text=True, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stderr
    assert int(result.stdout) > 0  # the second pass over the four blocks hits


def test_the_capacity_zip_holds_what_the_warm_up_zip_does() -> None:
    """The capacity job's functions reach the executors pickled by reference to
    spark_warmup.capacity.job, whose imports include spark_warmup.shipping and
    the modules the warm-up zip names there: each must be in the capacity zip
    too, or the executors fail to import the job."""
    assert set(WARMUP.sidecar_modules) <= set(CAPACITY.sidecar_modules)


def test_the_demo_example_is_a_valid_plan(tmp_path: Path) -> None:
    token_file = tmp_path / "admin.token"
    token_file.write_text("demo-token\n")
    document = example_plan("http://127.0.0.1:9330", "tiered", "http://127.0.0.1:9331",
                            [("orders", 2), ("clicks", 2)], admin_token_file=str(token_file))
    plan = parse_plan(json.loads(json.dumps(document)), env={})
    assert plan.admin_token == "demo-token"
    orders, clicks = plan.replays
    assert orders.partitions == (0, 1) and orders.offsets is not None
    assert clicks.partitions is None and clicks.times_ms is not None
    assert clicks.times_ms.first == 1_790_000_000_000
    text = example_instructions("/run/plan.json", document, "http://127.0.0.1:9330",
                                {"AWS_ACCESS_KEY_ID": "x"}, report_dir="/run/report")
    spark_job = python_module("spark_warmup")
    # Every Spark job printed for the demo, the dry run included, runs without a web UI.
    assert f"{spark_job} --conf spark.ui.enabled=false /run/plan.json --dry-run" in text
    assert all("--conf spark.ui.enabled=false" in line
               for line in text.splitlines() if f"{spark_job} " in line)
    assert f"{spark_job} --conf spark.ui.enabled=false /run/plan.json --report /run/report" \
        in text
    assert f"{program('sidecar')} replay --endpoint http://127.0.0.1:9330" in text
    assert "--topic clicks" in text
