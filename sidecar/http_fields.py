"""Header fields whose bytes are not text. Pure: no I/O.

RFC 9110 §5.5 lets a field value carry any octet (obs-text); aiohttp hands
values over decoded as UTF-8 with surrogateescape, so bytes that are not UTF-8
arrive as lone surrogates. Such a string cannot be encoded again: HMAC over it
(SigV4), re-signing it for the origin, comparing it with the admin token or
writing it to a log would raise deep inside. No S3 client sends one, so both
ports refuse it where the request enters, and logs show its bytes escaped.
"""

from __future__ import annotations

from collections.abc import Iterable


def is_text(value: str) -> bool:
    """Whether `value` came from valid UTF-8 (it encodes back without surrogates)."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def as_sent(value: str) -> str:
    """`value` for a log line: the bytes that were not UTF-8 as `\\xNN` escapes."""
    if is_text(value):
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def undecodable_field(fields: Iterable[tuple[str, str]]) -> str | None:
    """The name (printable) of the first field that is not text, or None."""
    for name, value in fields:
        if not (is_text(name) and is_text(value)):
            return as_sent(name)
    return None
