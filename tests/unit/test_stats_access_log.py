"""The JSON-lines access log: what one line says, and that lines reach their target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.telemetry.access_log import AccessLog, entry, format_entry


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
    line = format_entry(entry(**sample()))  # type: ignore[arg-type]
    assert "\n" not in line
    assert json.loads(line) == {
        "time": "2026-09-21T14:13:20.500Z", "request_id": "ABC", "method": "GET",
        "bucket": "tiered", "key": "orders-x/0/00000000000000000000-a.log",
        "range": "bytes=0-", "status": 206, "bytes": 1048576, "cache": "hit",
        "duration_s": 0.001235,
    }


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
