"""The JSON-lines access log: what one line says, and that lines reach their target."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from sidecar.model import PREFETCH, WARM, FetchDone, ObjectInfo
from sidecar.tally import CACHED, FETCHED, JOINED, ReadTally
from sidecar.telemetry import access_log
from sidecar.telemetry.access_log import (
    AccessLog,
    NodeFacts,
    ReadFacts,
    RotatingFile,
    entry,
    fetch_entry,
    format_entry,
)
from tests.support.waiting import eventually

NODE = NodeFacts("broker-1", 4 * 1024 * 1024, 64 * 1024 ** 3)


def sample(**changes: object) -> dict[str, object]:
    facts: dict[str, object] = dict(
        now=1_790_000_000.5, request_id="ABC", method="GET",
        raw_path="/tiered/orders-x/0/00000000000000000000-a.log?x-id=GetObject",
        range_header="bytes=0-", status=206, body_bytes=1048576, cache="hit",
        duration_s=0.00123456789,
    )
    facts.update(changes)
    return facts


def test_one_line_per_request_with_the_facts() -> None:
    tally = ReadTally()
    for block, how in ((3, CACHED), (4, JOINED), (5, FETCHED)):
        tally.add(block, how, PREFETCH)
    tally.origin_bytes = 4 << 20  # block 5, fetched by this request
    read = ReadFacts('"abc"', 100 << 20, first_byte=3 << 22, last_byte=(100 << 20) - 1,
                     tally=tally)
    line = format_entry(entry(**sample(), node=NODE, read=read))  # type: ignore[arg-type]
    assert "\n" not in line
    assert json.loads(line) == {
        "node": "broker-1", "time": "2026-09-21T14:13:20.500Z", "request_id": "ABC",
        "method": "GET", "bucket": "tiered", "key": "orders-x/0/00000000000000000000-a.log",
        "etag": '"abc"', "object_size": 100 << 20, "range": "bytes=0-",
        "first_byte": 3 << 22, "last_byte": (100 << 20) - 1, "status": 206,
        "bytes": 1048576, "block_size": 4 << 20, "blocks": {"first": 3, "found": "cjf"},
        "lane": "foreground", "cache": "hit", "duration_s": 0.001235,
        "cache_bytes": 64 * 1024 ** 3, "origin_bytes": 4 << 20, "cut_off": None,
    }


def test_a_background_fetch_has_a_line_of_its_own() -> None:
    info = ObjectInfo("tiered", "orders-x/0/00000000000000000000-a.log", (9 << 22) + 5,
                      '"abc"', datetime(2026, 9, 1, tzinfo=UTC))
    done = FetchDone(PREFETCH, info, first_block=8, last_block=9, origin_bytes=(4 << 20) + 5,
                     duration_s=0.0421234, ok=True)
    line = json.loads(format_entry(fetch_entry(now=1_790_000_000.5, done=done, node=NODE)))
    assert line == {
        "node": "broker-1", "time": "2026-09-21T14:13:20.500Z", "request_id": None,
        "method": "FETCH", "bucket": "tiered", "key": "orders-x/0/00000000000000000000-a.log",
        "etag": '"abc"', "object_size": (9 << 22) + 5, "range": None,
        "first_byte": 8 << 22, "last_byte": (9 << 22) + 4, "status": 200, "bytes": 0,
        "block_size": 4 << 20, "blocks": {"first": 8, "found": "ff"}, "lane": "prefetch",
        "cache": "none", "duration_s": 0.042123, "cache_bytes": 64 * 1024 ** 3,
        "origin_bytes": (4 << 20) + 5, "cut_off": None,
    }
    failed = fetch_entry(now=0, done=FetchDone(WARM, info, 0, 0, 0, 0.1, ok=False), node=NODE)
    assert (failed.status, failed.lane, failed.origin_bytes) == (500, "warm", 0)


def test_without_an_object_read_the_object_fields_are_null() -> None:
    item = entry(**sample(status=403, body_bytes=0, cache="none"), node=NODE)  # type: ignore[arg-type]
    assert (item.etag, item.object_size, item.first_byte, item.blocks, item.lane) == \
        (None, None, None, None, None)
    assert item.node == "broker-1" and item.block_size == 4 << 20


def test_the_lane_is_of_the_fetch_that_brought_the_bytes() -> None:
    joined = ReadTally()
    joined.add(0, CACHED)
    joined.add(1, JOINED, PREFETCH)
    assert joined.lane == PREFETCH and joined.letters == "cj"
    joined.add(1, FETCHED)  # the joined fetch failed: this request fetched it after all
    assert joined.lane == "foreground" and joined.letters == "cf"
    cached = ReadTally()
    cached.add(7, CACHED)
    assert cached.lane is None


def test_the_file_rotates_at_its_size_keeping_the_backups(tmp_path: Path) -> None:
    target = tmp_path / "access.jsonl"
    line_bytes = len(format_entry(entry(**sample(), node=NODE))) + 1  # type: ignore[arg-type]
    log = AccessLog(str(target), NODE, max_bytes=3 * line_bytes, backups=2)
    for number in range(10):
        log.write(entry(**sample(request_id=f"R{number}"), node=NODE))  # type: ignore[arg-type]
    log.close()
    kept = [[json.loads(line)["request_id"] for line in path.read_text().splitlines()]
            for path in (tmp_path / "access.jsonl.2", tmp_path / "access.jsonl.1", target)]
    assert kept == [["R3", "R4", "R5"], ["R6", "R7", "R8"], ["R9"]]
    assert not (tmp_path / "access.jsonl.3").exists()


def test_a_full_disk_drops_lines_and_counts_them() -> None:
    dropped: list[tuple[str, int]] = []
    # /dev/full: every write fails with ENOSPC, as on a full log disk.
    log = AccessLog("/dev/full", NODE, dropped=lambda reason, lines: dropped.append(
        (reason, lines)))
    for _ in range(3):
        log.write(entry(**sample(), node=NODE))  # type: ignore[arg-type]
    log.close()
    assert {reason for reason, _ in dropped} == {"disk"}
    assert sum(lines for _, lines in dropped) == 3


def test_keys_are_decoded_and_a_newline_cannot_split_a_line() -> None:
    item = entry(**sample(raw_path="/b/a%20key%0Awith%ZZ", range_header=None))  # type: ignore[arg-type]
    assert item.key == "a key\nwith%ZZ" and item.range is None
    line = format_entry(item)
    assert "\n" not in line and json.loads(line)["key"] == item.key


def test_lines_are_appended_to_the_file(tmp_path: Path) -> None:
    target = tmp_path / "access.jsonl"
    target.write_text('{"earlier": true}\n')
    log = AccessLog(str(target))
    for status in (200, 206, 404):
        log.write(entry(**sample(status=status)))  # type: ignore[arg-type]
    log.close()
    lines = target.read_text().splitlines()
    assert [json.loads(line).get("status") for line in lines] == [None, 200, 206, 404]


def test_dash_means_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    log = AccessLog("-")
    log.write(entry(**sample(cache="miss")))  # type: ignore[arg-type]
    log.close()
    assert json.loads(capsys.readouterr().out)["cache"] == "miss"


def test_a_file_emptied_when_full_has_each_batch_at_once(tmp_path: Path) -> None:
    """Without backups the file starts again empty when full: the lines after
    that are in it as soon as their batch is written, as before it."""
    target = tmp_path / "access.jsonl"
    line = (format_entry(entry(**sample(), node=NODE)) + "\n").encode()  # type: ignore[arg-type]
    rotating = RotatingFile(str(target), 3 * len(line), 0)
    try:
        rotating.write([line] * 3)
        assert target.read_bytes() == line * 3
        rotating.write([line] * 2)
        assert target.read_bytes() == line * 2
    finally:
        rotating.close()


def test_a_hung_disk_cannot_hold_the_stop(tmp_path: Path) -> None:
    dropped: list[tuple[str, int]] = []
    log = AccessLog(str(tmp_path / "access.jsonl"), NODE, queue_lines=2,
                    dropped=lambda reason, lines: dropped.append((reason, lines)))
    assert log._file is not None
    disk_back = threading.Event()
    writing = threading.Event()

    def hung(lines: list[bytes]) -> None:  # a write(2) that does not return
        writing.set()
        disk_back.wait()

    log._file.write = hung  # type: ignore[method-assign]
    try:
        log.write(entry(**sample(request_id="R0"), node=NODE))  # type: ignore[arg-type]
        assert writing.wait(10)
        for number in (1, 2):  # the queue is full behind the stuck writer
            log.write(entry(**sample(request_id=f"R{number}"), node=NODE))  # type: ignore[arg-type]
        started = time.monotonic()
        log.close(wait_s=0.3)
        assert time.monotonic() - started < 5
        # R0 in the stuck write, R1 and R2 queued behind it: all three lost.
        assert dropped == [("disk", 3)]
    finally:
        disk_back.set()


def test_a_deleted_log_file_is_opened_afresh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(access_log, "WATCH_EVERY_S", 0.0)  # checked at each batch
    target = tmp_path / "access.jsonl"
    log = AccessLog(str(target), NODE)
    log.write(entry(**sample(request_id="R1"), node=NODE))  # type: ignore[arg-type]
    eventually(lambda: (target.exists() and target.stat().st_size > 0) or None,
               "the first line written")
    target.unlink()  # an operator removes the live log
    log.write(entry(**sample(request_id="R2"), node=NODE))  # type: ignore[arg-type]
    log.close()
    assert [json.loads(line)["request_id"] for line in target.read_text().splitlines()] == [
        "R2"]


def test_a_disk_that_fails_after_a_rotation_counts_only_the_lines_it_lost(
    tmp_path: Path,
) -> None:
    """One batch: lines written before the file rotated are kept in PATH.1; the
    disk refusing the lines after it drops only those."""
    target = tmp_path / "access.jsonl"
    line_bytes = len(format_entry(entry(**sample(), node=NODE))) + 1  # type: ignore[arg-type]
    in_rotation, go_on = threading.Event(), threading.Event()
    rotations: list[str] = []

    def rotated(path: str) -> None:
        rotations.append(path)
        if len(rotations) == 1:  # the writer waits here while the next batch queues
            in_rotation.set()
            go_on.wait(10)
        else:  # the new PATH is on a full disk
            target.symlink_to("/dev/full")

    dropped: list[tuple[str, int]] = []
    log = AccessLog(str(target), NODE, max_bytes=2 * line_bytes, backups=2, rotated=rotated,
                    dropped=lambda reason, lines: dropped.append((reason, lines)))
    for number in range(3):
        log.write(entry(**sample(request_id=f"R{number}"), node=NODE))  # type: ignore[arg-type]
    assert in_rotation.wait(10)
    # R3 fills the file R2 starts; R4 rotates it out and meets the full disk.
    for number in range(3, 6):
        log.write(entry(**sample(request_id=f"R{number}"), node=NODE))  # type: ignore[arg-type]
    go_on.set()
    log.close()
    kept = [json.loads(line)["request_id"]
            for name in ("access.jsonl.2", "access.jsonl.1")
            for line in (tmp_path / name).read_text().splitlines()]
    assert kept == ["R0", "R1", "R2", "R3"]
    assert dropped == [("disk", 2)]
