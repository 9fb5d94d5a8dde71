"""Log records as JSON lines or text: fields, escaping, the auto choice."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from datetime import datetime
from pathlib import Path

import pytest

from sidecar.telemetry.logs import (
    CURRENT_REQUEST,
    JsonFormatter,
    RequestIdFilter,
    TextFormatter,
    choose_format,
    extra_fields,
    formatter_for,
    iso_utc,
)


def make_record(
    msg: str = "request %s failed", args: tuple[object, ...] = ("ABC",),
    extra: dict[str, object] | None = None, exc: bool = False, level: int = logging.ERROR,
) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError('bad "value"\nsecond line')
        except ValueError:
            exc_info = sys.exc_info()
    record = logging.getLogger("sidecar.s3.dataport").makeRecord(
        "sidecar.s3.dataport", level, __file__, 10, msg, args, exc_info, extra=extra,
    )
    record.created = 1_790_000_000.25  # 2026-09-21T...Z, fixed for the assertions
    return record


def test_json_line_has_core_fields_and_extras() -> None:
    record = make_record(extra={"request_id": "ABC", "bucket": "tiered", "key": "k/0.log",
                                "mode": "bypass"})
    line = JsonFormatter().format(record)
    assert "\n" not in line
    fields = json.loads(line)
    assert list(fields)[:4] == ["ts", "level", "logger", "msg"]
    assert fields["level"] == "ERROR" and fields["logger"] == "sidecar.s3.dataport"
    assert fields["msg"] == "request ABC failed"
    assert (fields["request_id"], fields["bucket"], fields["key"], fields["mode"]) == (
        "ABC", "tiered", "k/0.log", "bypass")
    assert "exc" not in fields and "args" not in fields and "levelno" not in fields


def test_timestamp_is_iso_8601_utc_with_milliseconds() -> None:
    stamp = iso_utc(1_790_000_000.25)
    assert stamp.endswith(".250Z")
    parsed = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert parsed.timestamp() == 1_790_000_000.25
    assert json.loads(JsonFormatter().format(make_record()))["ts"] == stamp


def test_exception_is_one_escaped_string_field() -> None:
    line = JsonFormatter().format(make_record(exc=True))
    assert "\n" not in line
    fields = json.loads(line)
    assert fields["exc"].startswith("Traceback (most recent call last):")
    assert 'ValueError: bad "value"\nsecond line' in fields["exc"]


def test_extras_never_replace_core_fields_and_odd_values_still_log() -> None:
    record = make_record(extra={"level": "spoofed", "path": Path("/c"), "nums": (1, 2)})
    fields = json.loads(JsonFormatter().format(record))
    assert fields["level"] == "ERROR"
    assert fields["path"] == "/c" and fields["nums"] == [1, 2]


def test_text_line_keeps_the_old_shape_and_appends_extras() -> None:
    record = make_record(extra={"request_id": "ABC", "reason": "disk full", "n": 3})
    line = TextFormatter().format(record)
    assert " ERROR sidecar.s3.dataport: request ABC failed " in line
    assert line.endswith('request_id=ABC reason="disk full" n=3')
    plain = TextFormatter().format(make_record())
    assert plain.endswith("sidecar.s3.dataport: request ABC failed")
    with_exc = TextFormatter().format(make_record(exc=True))
    assert "\nTraceback (most recent call last):" in with_exc


def test_extra_fields_are_only_what_the_call_added() -> None:
    assert list(extra_fields(make_record())) == []
    assert dict(extra_fields(make_record(extra={"mode": "normal"}))) == {"mode": "normal"}


@pytest.mark.parametrize(
    ("setting", "terminal", "chosen"),
    [("auto", True, "text"), ("auto", False, "json"), ("json", True, "json"),
     ("text", False, "text")],
)
def test_auto_means_text_on_a_terminal(setting: str, terminal: bool, chosen: str) -> None:
    assert choose_format(setting, terminal) == chosen
    expected = TextFormatter if chosen == "text" else JsonFormatter
    assert isinstance(formatter_for(choose_format(setting, terminal)), expected)


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log format"):
        choose_format("yaml", False)


def test_records_written_within_a_request_carry_its_id() -> None:
    def record(**extra: object) -> logging.LogRecord:
        made = logging.LogRecord("sidecar.engine", logging.WARNING, "", 0, "fetch failed",
                                 None, None)
        made.__dict__.update(extra)
        return made

    stamp = RequestIdFilter()
    outside = record()
    assert stamp.filter(outside) and not hasattr(outside, "request_id")

    def within() -> tuple[logging.LogRecord, logging.LogRecord]:
        CURRENT_REQUEST.set("0A1B2C3D4E5F6071")
        plain, given = record(), record(request_id="GIVEN")
        stamp.filter(plain)
        stamp.filter(given)
        return plain, given

    plain, given = contextvars.copy_context().run(within)
    assert plain.request_id == "0A1B2C3D4E5F6071"  # type: ignore[attr-defined]
    assert given.request_id == "GIVEN"  # type: ignore[attr-defined]
    assert json.loads(JsonFormatter().format(plain))["request_id"] == "0A1B2C3D4E5F6071"
    assert CURRENT_REQUEST.get() is None


def test_a_text_line_escapes_the_controls_a_client_put_in_its_message() -> None:
    key = "k\r\n2026-01-01 00:00:00,000 ERROR sidecar: forged\x1b[2J\x00\x7f\x9b\u2028\tend"
    line = TextFormatter().format(make_record("miss %s", (key,),
                                              extra={"key": key}, level=logging.INFO))
    assert "\n" not in line and "\r" not in line
    assert not set(line) & {"\x1b", "\x00", "\x7f", "\x9b", "\u2028"}
    assert ("miss k\\r\\n2026-01-01 00:00:00,000 ERROR sidecar: forged\\x1b[2J\\x00\\x7f"
            "\\x9b\\u2028\tend") in line
    # A traceback still takes the lines below the (escaped) message.
    with_exc = TextFormatter().format(make_record("miss %s", (key,), exc=True))
    first, _, rest = with_exc.partition("\n")
    assert "forged" in first and rest.startswith("Traceback (most recent call last):")
