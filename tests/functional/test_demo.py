"""`sidecar demo` (what `make run` runs): genuine segments, with their indexes and
manifests, readable through the sidecar; a banner whose every URL and command
works and whose last line is "Press Ctrl-C to stop."; files in a directory of
the run's own, gone when it stops."""

from __future__ import annotations

import json
import os
import queue
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import urllib.request
from pathlib import Path
from typing import Any

from sidecar.layout import parse_aiven_key
from sidecar.tools.commands import program
from sidecar.tools.kafka_segments import BatchHeader, iter_segment_batches
from tests.support.s3_clients import s3_client
from tests.support.waiting import eventually

BANNER_END = "Press Ctrl-C to stop."


def found(pattern: str, banner: str) -> str:
    match = re.search(pattern, banner, re.M)
    assert match, f"{pattern!r} not in the banner:\n{banner}"
    return match.group(1)


def check_indexes(client: Any, log_key: str, log: bytes, batches: list[BatchHeader]) -> None:
    """The segment's .indexes, located by its .rsm-manifest, index the .log's batches."""
    segment = parse_aiven_key(log_key)
    assert segment is not None
    manifest = json.loads(client.get_object(
        Bucket="tiered", Key=segment.with_suffix("rsm-manifest").key)["Body"].read())
    indexes = client.get_object(Bucket="tiered", Key=segment.with_suffix("indexes").key)
    body = indexes["Body"].read()
    assert manifest["version"] == "1" and manifest["compression"] is False
    assert manifest["chunkIndex"]["originalFileSize"] == len(log)
    parts = manifest["segmentIndexes"]
    assert parts["transaction"] is None
    assert sum(parts[name]["size"] for name in ("offset", "timestamp", "producerSnapshot",
                                                 "leaderEpoch")) == len(body)

    def part(name: str) -> bytes:
        return body[parts[name]["position"]:parts[name]["position"] + parts[name]["size"]]

    by_position, position = {}, 0
    for batch in batches:
        by_position[position] = batch
        position += batch.total_size
    offset_index = list(struct.iter_unpack(">ii", part("offset")))
    assert len(offset_index) > 8
    for relative_offset, batch_position in offset_index:
        # Each entry maps a batch's last offset to where that batch starts.
        assert by_position[batch_position].last_offset == segment.start_offset + relative_offset
    time_index = list(struct.iter_unpack(">qi", part("timestamp")))
    assert [ts for ts, _ in time_index] == sorted({ts for ts, _ in time_index})
    assert time_index[-1] == (batches[-1].max_timestamp,
                              batches[-1].last_offset - segment.start_offset)
    assert part("leaderEpoch") == b"0\n1\n0 %d\n" % segment.start_offset


def test_demo_serves_genuine_segments_through_the_sidecar() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "demo", "--listen", "127.0.0.1:0",
         "--admin-listen", "127.0.0.1:0", "--seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "SIDECAR_LOG_LEVEL": "WARNING"},
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    pump = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout],  # type: ignore[union-attr]
                            daemon=True)
    pump.start()
    output: list[str] = []
    try:
        while BANNER_END not in "".join(output):
            output.append(lines.get(timeout=90))
        banner = "".join(output)
        endpoint = found(r"sidecar S3 endpoint:\s+(\S+)", banner)
        key = found(r"--key (\S+) --range", banner)
        client = s3_client(endpoint)
        body = client.get_object(Bucket="tiered", Key=key)["Body"].read()
        batches = list(iter_segment_batches(body))  # every CRC checked
        assert batches[0].base_offset == 0 and len(body) > 8 * 1024 * 1024
        first_mib = client.get_object(Bucket="tiered", Key=key, Range="bytes=0-1048575")
        assert first_mib["Body"].read() == body[:1048576]

        # Every segment has its .indexes and .rsm-manifest, named as Aiven's plugin names them.
        listed = [item["Key"] for page in client.get_paginator("list_objects_v2").paginate(
            Bucket="tiered") for item in page["Contents"]]
        by_segment: dict[str, set[str]] = {}
        for listed_key in listed:
            segment = parse_aiven_key(listed_key)
            assert segment is not None, listed_key
            by_segment.setdefault(segment.with_suffix("log").key, set()).add(segment.suffix)
        assert len(by_segment) >= 10 and key in by_segment
        assert all(suffixes == {"log", "indexes", "rsm-manifest"}
                   for suffixes in by_segment.values()), by_segment
        check_indexes(client, key, body, batches)

        # The page and the stats command the banner names work as printed.
        ui = found(r"^\s+live hit rates \(browser\):\s+(\S+/ui)$", banner)
        with urllib.request.urlopen(ui, timeout=10) as page:
            assert b"<canvas" in page.read()
        # As printed, from where the demo ran: the venv's own `sidecar` (its path when
        # PATH does not find it, as after `make run`).
        stats_command = found(r"^\s+(\S*sidecar stats --admin \S+)$", banner).split()
        assert stats_command[0] == program("sidecar")
        stats = subprocess.run(stats_command, capture_output=True, text=True, timeout=60)
        assert stats.returncode == 0, stats.stderr
        assert re.search(r"byte hit ratio\s+\d", stats.stdout), stats.stdout

        # The example warm-up plan lives in this run's own directory.
        run_dir = Path(found(r"^Demo files: (\S+) \(its cache is removed", banner))
        plan = Path(found(r"example plan written to (\S+)\)", banner))
        assert run_dir.is_dir() and run_dir.name.startswith("sidecar-demo-")
        assert run_dir.resolve() != Path(tempfile.gettempdir()).resolve()
        assert plan.parent == run_dir and json.loads(plan.read_text())["replays"]
        assert f"--report {run_dir}/" in banner

        # The capacity analysis of the demo's own access log runs as printed.
        analysis = found(r"^\s+(\S*python\S* -m spark_warmup.capacity --conf "
                         r"spark.ui.enabled=false --logs \S+ --report \S+)$", banner).split()
        log = Path(analysis[analysis.index("--logs") + 1])
        assert log.parent == run_dir
        eventually(lambda: key in log.read_text() if log.exists() else None,
                   "the reads in the demo's access log", timeout=10)
        report = Path(analysis[analysis.index("--report") + 1])
        analysed = subprocess.run(analysis, capture_output=True, text=True, timeout=600)
        assert analysed.returncode == 0, analysed.stderr[-3000:]
        summary = json.loads((report / "summary.json").read_text())
        assert summary["nodes"]["demo"]["served_bytes"] >= len(body) + 1048576
        assert (report / "report.html").exists()
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        pump.join(timeout=10)
        process.stdout.close()
    while not lines.empty():
        output.append(lines.get_nowait())
    printed = [line.rstrip("\n") for line in output if line.strip()]
    # Everything else comes before it; at the stop, only where its files stay.
    assert printed[-2] == BANNER_END and printed.count(BANNER_END) == 1
    assert printed[-1] == (f"Kept after the demo: {run_dir} (access log, warm-up plan and "
                           "reports; the cache was removed)")
    # What it asked you to open is still there; its cache is not.
    try:
        assert (run_dir / "access.log").stat().st_size > 0
        assert (run_dir / "capacity-report" / "report.html").exists()
        assert (run_dir / "warmup-plan.json").exists()
        assert not (run_dir / "cache").exists()
    finally:
        shutil.rmtree(run_dir)


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (from /proc: field 4 of stat is the parent)."""
    found_pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # it ended while we looked
        if int(fields[1]) == pid:
            found_pids.append(int(stat.parent.name))
    return found_pids


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_sigterm_while_the_demo_starts_leaves_no_cache_and_no_child(tmp_path: Path) -> None:
    """SIGTERM (a service manager, `kill`, `timeout`) while the demo fills its bucket:
    it stops as it does once serving, its cache removed and its local S3 ended."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "demo", "--listen", "127.0.0.1:0",
         "--admin-listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "TMPDIR": str(tmp_path), "SIDECAR_LOG_LEVEL": "WARNING"},
    )
    try:
        # The local S3 is up and the bucket being filled: the start's longest step.
        local_s3 = eventually(
            lambda: next((child for child in _children(process.pid)
                          if b"sidecar.tools.local_s3" in Path(f"/proc/{child}/cmdline")
                          .read_bytes()), None),
            "the demo's local S3 process", timeout=60)
        run_dir = eventually(lambda: next(tmp_path.glob("sidecar-demo-*/cache"), None),
                             "the demo's cache directory").parent
        process.send_signal(signal.SIGTERM)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr, stderr
    assert not _running(local_s3)
    # It never said where its files were: none are left (cache, access log).
    assert not run_dir.exists()
    assert stdout.strip() == ""


def test_a_demo_whose_port_is_taken_says_so_and_leaves_nothing(tmp_path: Path) -> None:
    """A second demo on the default ports, or any port in use: one line, exit 2, and
    no directory left behind for a demo that never served."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        result = subprocess.run(
            [sys.executable, "-m", "sidecar", "demo", "--listen", address,
             "--admin-listen", "127.0.0.1:0"],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "TMPDIR": str(tmp_path), "SIDECAR_LOG_LEVEL": "WARNING"})
    assert result.returncode == 2, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if not line.startswith("{")]
    assert errors == [f"sidecar: error: cannot listen on {address}: error while attempting "
                      f"to bind on address ('127.0.0.1', {address.rsplit(':', 1)[1]}): "
                      "address already in use"], result.stderr[-2000:]
    assert result.stdout.strip() == ""
    assert list(tmp_path.iterdir()) == []
