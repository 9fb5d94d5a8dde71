"""The few pieces of HTTP/1.1 a ranged GET needs: pure, no sockets.

RFC 9112 (HTTP/1.1 message syntax): a request head, a response head's status
line and fields, and how the body is framed (section 6.3: Transfer-Encoding
chunked, else Content-Length, else until the connection closes). S3 error
bodies are XML with a `<Code>` (S3 API Reference, "Error responses").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# A response head larger than this is not an object store's answer.
MAX_HEAD_BYTES = 64 * 1024
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3})(?: ([^\r\n]*))?$")
_CODE = re.compile(rb"<Code>([^<]{1,128})</Code>")


class MalformedAnswer(ValueError):
    """The origin's answer is not HTTP/1.1 as RFC 9112 frames it."""


@dataclass(frozen=True)
class ResponseHead:
    status: int
    reason: str
    fields: dict[str, str]  # lower-case names; a repeated field's values joined by ", "

    def get(self, name: str) -> str | None:
        return self.fields.get(name)

    @property
    def content_length(self) -> int | None:
        value = self.fields.get("content-length")
        if value is None:
            return None
        # 1*DIGIT (RFC 9110 section 8.6), ASCII only: fields are read as
        # latin-1, where superscripts pass str.isdigit() and then fail int().
        if not (value.isascii() and value.isdigit()):
            raise MalformedAnswer(f"Content-Length {value!r}")
        return int(value)

    @property
    def chunked(self) -> bool:
        codings = self.fields.get("transfer-encoding", "")
        return codings.lower().replace(" ", "").endswith("chunked")

    @property
    def keeps_alive(self) -> bool:
        """Whether the connection may carry another request (RFC 9112 section 9.3)."""
        return "close" not in self.fields.get("connection", "").lower()


def request_head(target: str, host: str, fields: list[tuple[str, str]]) -> bytes:
    """`GET target HTTP/1.1` with Host first, then `fields`, then the blank line."""
    lines = [f"GET {target} HTTP/1.1", f"Host: {host}"]
    lines.extend(f"{name}: {value}" for name, value in fields)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def head_end(buffer: bytes | bytearray) -> int:
    """Index just past the blank line that ends a response head, or -1."""
    end = buffer.find(b"\r\n\r\n")
    return -1 if end < 0 else end + 4


def parse_head(raw: bytes | bytearray) -> ResponseHead:
    """A response head (status line and fields, up to and including the blank line)."""
    lines = bytes(raw).split(b"\r\n")
    match = _STATUS_LINE.match(lines[0])
    if match is None:
        raise MalformedAnswer(f"status line {lines[0][:80]!r}")
    fields: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise MalformedAnswer(f"field line {line[:80]!r}")
        key = name.decode("latin-1").lower()
        text = value.strip().decode("latin-1")
        fields[key] = f"{fields[key]}, {text}" if key in fields else text
    return ResponseHead(int(match.group(1)), (match.group(2) or b"").decode("latin-1"), fields)


def parse_chunk_size(line: bytes | bytearray) -> int:
    """The size of a chunk from its size line (extensions ignored), RFC 9112 section 7.1."""
    size = bytes(line).split(b";", 1)[0].strip()
    try:
        return int(size, 16)
    except ValueError:
        raise MalformedAnswer(f"chunk size line {bytes(line)[:40]!r}") from None


def s3_error_code(body: bytes | bytearray) -> str:
    """The `<Code>` of an S3 error body, or "" when there is none."""
    match = _CODE.search(bytes(body))
    return match.group(1).decode("utf-8", "replace") if match else ""
