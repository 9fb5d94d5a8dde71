"""Log records as JSON lines for collectors, or as plain text for a person at a terminal.

A JSON line is one object: `ts` (ISO 8601 in UTC, milliseconds), `level`,
`logger`, `msg` (the formatted message), then every extra field the call
passed (`log.warning(..., extra={"request_id": rid, "mode": "bypass"})`), and
`exc` / `stack` when there is a traceback. json.dumps escapes newlines, so a
traceback never breaks the one-record-per-line framing a log shipper relies on
(Fluent Bit, Vector and Loki's promtail all split on newlines first).

Text lines keep the old shape, `TIME LEVEL logger: message`, with the extra
fields appended as `key=value`. Control characters in the message (CR, LF, ESC,
the C1 controls, U+2028/9) are written escaped (`\r`, `\x1b`, `\u2028`): a
message quotes keys and header values a client chose, and a raw CR/LF would let
it forge a line of its own (log injection, CWE-117), ESC would drive a terminal.
Only a traceback's lines, which come after the message, break the line.

Every line written on behalf of a data-port request carries its `request_id`
(the client's x-amz-request-id, the access log's id): the data port sets
CURRENT_REQUEST for the length of the request, asyncio copies it into every task
the request starts (its origin fetches), and RequestIdFilter puts it on the
record, so an origin failure or a cut-off answer can be traced to its request.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["json", "text"]

# Attributes every LogRecord has; anything else on a record came from `extra=`.
# `message` and `asctime` are added by Formatter.format, `taskName` by 3.12+.
_STANDARD_ATTRIBUTES = frozenset(
    vars(logging.LogRecord("", logging.INFO, "", 0, "", None, None))
) | {"message", "asctime", "taskName"}

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

CURRENT_REQUEST: ContextVar[str | None] = ContextVar("sidecar_request_id", default=None)


class RequestIdFilter(logging.Filter):
    """Adds `request_id` from CURRENT_REQUEST to records that have none. A filter
    runs in the thread that logs, where the request's context is."""

    def filter(self, record: logging.LogRecord) -> bool:
        request_id = CURRENT_REQUEST.get()
        if request_id is not None and not hasattr(record, "request_id"):
            record.request_id = request_id
        return True


def choose_format(setting: str, is_terminal: bool) -> LogFormat:
    """`auto` means text for a person at a terminal, JSON for everything that collects logs."""
    if setting == "json":
        return "json"
    if setting == "text":
        return "text"
    if setting != "auto":
        raise ValueError(f"unknown log format {setting!r} (expected auto, json or text)")
    return "text" if is_terminal else "json"


def extra_fields(record: logging.LogRecord) -> Iterator[tuple[str, object]]:
    """The fields a call added with `extra=`, in the order it gave them."""
    for name, value in vars(record).items():
        if name not in _STANDARD_ATTRIBUTES and not name.startswith("_"):
            yield name, value


def iso_utc(created: float) -> str:
    """`2026-11-01T06:00:00.123Z`: RFC 3339 / ISO 8601 in UTC, what log stores index on."""
    stamp = datetime.fromtimestamp(created, tz=UTC).isoformat(timespec="milliseconds")
    return stamp.removesuffix("+00:00") + "Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record. Extra fields never overwrite the four core ones."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, object] = {
            "ts": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, value in extra_fields(record):
            fields.setdefault(name, value)
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            fields["exc"] = record.exc_text
        if record.stack_info:
            fields["stack"] = self.formatStack(record.stack_info)
        # default=str: a Path, an enum or an exception given as an extra field
        # is shown, never a reason to lose the record.
        return json.dumps(fields, default=str)


class TextFormatter(logging.Formatter):
    """`TIME LEVEL logger: message key=value ...`, traceback on the lines below."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatMessage(self, record: logging.LogRecord) -> str:
        line = escape_controls(super().formatMessage(record))
        extras = " ".join(f"{name}={_text_value(value)}" for name, value in extra_fields(record))
        return f"{line} {extras}" if extras else line


# Every C0 control but TAB, DEL, the C1 controls, and the Unicode line and
# paragraph separators (which some viewers break lines at).
_CONTROLS = {code: ascii(chr(code))[1:-1]
             for code in (*range(0x00, 0x09), *range(0x0A, 0x20), *range(0x7F, 0xA0),
                          0x2028, 0x2029)}


def escape_controls(text: str) -> str:
    """`text` with control characters written as Python escapes: one line, inert."""
    return text.translate(_CONTROLS)


def _text_value(value: object) -> str:
    if isinstance(value, str) and value and not any(c.isspace() or c in '"=' for c in value):
        return value
    return json.dumps(value, default=str)


def formatter_for(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else TextFormatter()
