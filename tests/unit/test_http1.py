"""The HTTP/1.1 pieces a ranged GET needs (RFC 9112), pure."""

from __future__ import annotations

import pytest

from sidecar.origin.http1 import (
    MalformedAnswer,
    head_end,
    parse_chunk_size,
    parse_head,
    request_head,
    s3_error_code,
)


def test_a_request_head_puts_host_first_and_ends_with_a_blank_line() -> None:
    raw = request_head("/b/k?X-Amz-Signature=ab", "127.0.0.1:9000",
                       [("Range", "bytes=0-9"), ("If-Match", '"e"')])
    assert raw == (b'GET /b/k?X-Amz-Signature=ab HTTP/1.1\r\nHost: 127.0.0.1:9000\r\n'
                   b'Range: bytes=0-9\r\nIf-Match: "e"\r\n\r\n')


def test_a_response_head_is_split_into_status_and_lower_case_fields() -> None:
    raw = (b"HTTP/1.1 206 Partial Content\r\nContent-Length: 10\r\n"
           b"Content-Range: bytes 0-9/100\r\nETag: \"e\"\r\nX-Amz-Meta-A: 1\r\n"
           b"x-amz-meta-a: 2\r\n\r\nBODY")
    end = head_end(raw)
    assert raw[end:] == b"BODY"
    head = parse_head(raw[:end])
    assert (head.status, head.reason) == (206, "Partial Content")
    assert head.content_length == 10 and head.get("content-range") == "bytes 0-9/100"
    assert head.get("etag") == '"e"'
    assert head.get("x-amz-meta-a") == "1, 2"  # repeated fields joined (RFC 9110 5.3)
    assert head.keeps_alive and not head.chunked


def test_framing_and_connection_fields() -> None:
    head = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n"
                      b"Connection: close\r\n\r\n")
    assert head.chunked and not head.keeps_alive and head.content_length is None
    assert head_end(b"HTTP/1.1 200 OK\r\nA: b\r\n") == -1


@pytest.mark.parametrize("raw", [
    b"HTTP/2 200\r\n\r\n", b"ICY 200 OK\r\n\r\n", b"HTTP/1.1 20 OK\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", b"HTTP/1.1 200 OK\r\n Folded: x\r\n\r\n",
])
def test_malformed_heads_are_refused(raw: bytes) -> None:
    with pytest.raises(MalformedAnswer):
        parse_head(raw)


def test_a_non_numeric_content_length_is_malformed() -> None:
    with pytest.raises(MalformedAnswer):
        _ = parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: 1e3\r\n\r\n").content_length


@pytest.mark.parametrize("value", [b"1\xb2", b"\xb9\xb2", b"+10", b" 1 0"])
def test_only_ascii_digits_make_a_content_length(value: bytes) -> None:
    # Fields are read as latin-1, where superscript digits pass str.isdigit()
    # and then fail int(): they must be a malformed answer, not a ValueError.
    head = parse_head(b"HTTP/1.1 206 Partial Content\r\nContent-Length: " + value + b"\r\n\r\n")
    with pytest.raises(MalformedAnswer):
        _ = head.content_length


def test_chunk_sizes_and_s3_error_codes() -> None:
    assert parse_chunk_size(b"1f;name=value") == 31
    with pytest.raises(MalformedAnswer):
        parse_chunk_size(b"zz")
    assert s3_error_code(b"<Error><Code>SlowDown</Code><Message>x</Message></Error>") \
        == "SlowDown"
    assert s3_error_code(b"<html>bad gateway</html>") == ""
