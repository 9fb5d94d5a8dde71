"""Header values that are not UTF-8 (sidecar.http_fields)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from sidecar.http_fields import as_sent, is_text, undecodable_field


def arrived(raw: bytes) -> str:
    """A field value as aiohttp hands it over."""
    return raw.decode("utf-8", "surrogateescape")


@given(st.text())
def test_valid_utf8_is_text_and_logged_unchanged(value: str) -> None:
    raw = value.encode("utf-8", "surrogatepass")
    if is_text(arrived(raw)):
        assert as_sent(arrived(raw)) == arrived(raw)


@given(st.binary())
def test_anything_that_arrives_can_be_logged_and_encoded(raw: bytes) -> None:
    value = arrived(raw)
    shown = as_sent(value)
    shown.encode("utf-8")  # never raises: a log line can always be written
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        assert not is_text(value)
        assert "\\x" in shown
    else:
        assert is_text(value) and shown == value


def test_the_first_unreadable_field_is_named() -> None:
    fields = [("Host", "h"), ("Range", "bytes=0-9"), ("X-A", arrived(b"\xff")),
              ("X-B", arrived(b"\xfe"))]
    assert undecodable_field(fields) == "X-A"
    assert undecodable_field(fields[:2]) is None
    assert undecodable_field([(arrived(b"X-\xff"), "v")]) == "X-\\xff"
    assert as_sent(arrived(b"bytes=0-\xff")) == "bytes=0-\\xff"
    assert is_text("caf\u00e9 \u4e2d")
