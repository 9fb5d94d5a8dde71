"""The `aws-chunked` content encoding of S3 uploads: an incremental decoder and
the unsigned-trailer framing. Pure: bytes in, bytes out.

Signed streaming uploads (x-amz-content-sha256 `STREAMING-AWS4-HMAC-SHA256-PAYLOAD`
and its `-TRAILER` and SigV4a `ECDSA-P256` variants) frame the body as

    hex(size);chunk-signature=<sig>\\r\\n <size bytes> \\r\\n   ...repeated...
    0;chunk-signature=<sig>\\r\\n
    [trailer-name:value\\r\\n ... x-amz-trailer-signature:<sig>\\r\\n]
    \\r\\n

(https://docs.aws.amazon.com/AmazonS3/latest/API/sigv4-streaming.html and
sigv4-streaming-trailers.html). Each chunk signature chains to the previous one
and, first, to the client's request signature, so a proxy that re-signs the
request cannot forward the frames as they are: it decodes them and sends the
plain bytes, or re-frames them as `STREAMING-UNSIGNED-PAYLOAD-TRAILER`
(the same framing without chunk extensions) so the trailing checksum still
reaches the origin, which verifies it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# A chunk header is a hex size and one `;chunk-signature=` extension (about 90
# bytes); a trailer line is a header name and a base64 checksum. Anything much
# longer is not aws-chunked, and must not make the decoder buffer without bound.
MAX_LINE = 4096
MAX_TRAILER_LINES = 16
# The size field of a chunk: S3 chunks are at least 8 KiB and well under 2**40.
_MAX_SIZE_DIGITS = 16

# Base64 length of each checksum S3 accepts as a trailer
# (https://docs.aws.amazon.com/AmazonS3/latest/userguide/checking-object-integrity.html):
# the framing's total length must be known before the body is sent.
CHECKSUM_TRAILER_LENGTHS = {
    "x-amz-checksum-crc32": 8,
    "x-amz-checksum-crc32c": 8,
    "x-amz-checksum-crc64nvme": 12,
    "x-amz-checksum-sha1": 28,
    "x-amz-checksum-sha256": 44,
}


class ChunkedFormatError(ValueError):
    """The body is not valid aws-chunked framing."""


@dataclass
class AwsChunkedDecoder:
    """Feed the encoded body in pieces of any size; get the payload bytes back.

    Memory is bounded by MAX_LINE plus the piece being fed: payload bytes are
    returned as slices of the input, never collected.
    """

    _state: str = "header"  # header | data | data_end | trailer | done
    _line: bytearray = field(default_factory=bytearray)
    _remaining: int = 0
    decoded_bytes: int = 0
    trailers: list[tuple[str, str]] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return self._state == "done"

    def feed(self, data: bytes | memoryview) -> list[memoryview]:
        """The payload bytes in ``data`` (possibly none), in order."""
        view = memoryview(data)
        out: list[memoryview] = []
        while view:
            if self._state == "done":
                raise ChunkedFormatError("bytes after the end of the aws-chunked body")
            if self._state == "data":
                take = view[: self._remaining]
                self._remaining -= len(take)
                self.decoded_bytes += len(take)
                out.append(take)
                view = view[len(take):]
                if not self._remaining:
                    self._state = "data_end"
                continue
            line, view = self._take_line(view)
            if line is None:
                continue
            if self._state == "header":
                self._chunk_header(line)
            elif self._state == "data_end":
                if line:
                    raise ChunkedFormatError("a chunk is longer than its declared size")
                self._state = "header"
            else:
                self._trailer_line(line)
        return out

    def _take_line(self, view: memoryview) -> tuple[bytes | None, memoryview]:
        """Collect up to CRLF; the line without it, or None while incomplete."""
        end = bytes(view[: MAX_LINE + 1]).find(b"\n")
        if end < 0:
            self._line += view
            if len(self._line) > MAX_LINE:
                raise ChunkedFormatError("aws-chunked line too long")
            return None, view[len(view):]
        self._line += view[:end + 1]
        if len(self._line) > MAX_LINE:
            raise ChunkedFormatError("aws-chunked line too long")
        line = bytes(self._line)
        self._line.clear()
        if not line.endswith(b"\r\n"):
            raise ChunkedFormatError("aws-chunked line not ended by CRLF")
        return line[:-2], view[end + 1:]

    def _chunk_header(self, line: bytes) -> None:
        size_field = line.partition(b";")[0].strip()
        if not size_field or len(size_field) > _MAX_SIZE_DIGITS or \
                any(c not in b"0123456789abcdefABCDEF" for c in size_field):
            raise ChunkedFormatError(f"bad aws-chunked chunk header {line[:64]!r}")
        size = int(size_field, 16)
        if size:
            self._remaining = size
            self._state = "data"
        else:
            self._state = "trailer"

    def _trailer_line(self, line: bytes) -> None:
        if not line:
            self._state = "done"
            return
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon or not name.strip():
            raise ChunkedFormatError(f"bad aws-chunked trailer line {line[:64]!r}")
        if len(self.trailers) >= MAX_TRAILER_LINES:
            raise ChunkedFormatError("too many aws-chunked trailer lines")
        self.trailers.append((name.strip().lower(), value.strip()))


def unsigned_chunk(data: bytes | bytearray | memoryview) -> bytes:
    """One chunk of the STREAMING-UNSIGNED-PAYLOAD-TRAILER framing (non-empty data)."""
    return b"%x\r\n%s\r\n" % (len(data), bytes(data))


def unsigned_trailer_end(trailers: list[tuple[str, str]]) -> bytes:
    """The final zero chunk, the trailer lines and the closing CRLF."""
    lines = b"".join(f"{name}:{value}\r\n".encode("latin-1") for name, value in trailers)
    return b"0\r\n" + lines + b"\r\n"


def unsigned_trailer_length(decoded_length: int, chunk_size: int, trailer: str) -> int | None:
    """Bytes of the unsigned-trailer framing of ``decoded_length`` payload bytes cut
    into ``chunk_size`` chunks, with the one checksum trailer named ``trailer``.

    None when that checksum's length is not known (the framing cannot be sized).
    """
    value_length = CHECKSUM_TRAILER_LENGTHS.get(trailer.strip().lower())
    if value_length is None:
        return None
    full, rest = divmod(decoded_length, chunk_size)
    total = full * (len(b"%x" % chunk_size) + 2 + chunk_size + 2)
    if rest:
        total += len(b"%x" % rest) + 2 + rest + 2
    return total + len(b"0\r\n") + len(trailer.strip()) + 1 + value_length + 2 + 2


@dataclass
class Rechunker:
    """Cut a stream of payload pieces into chunks of exactly ``chunk_size`` bytes
    (the last one shorter), framed as unsigned aws-chunked chunks."""

    chunk_size: int
    _pending: bytearray = field(default_factory=bytearray)

    def feed(self, data: bytes | memoryview) -> list[bytes]:
        self._pending += data
        out: list[bytes] = []
        while len(self._pending) >= self.chunk_size:
            out.append(unsigned_chunk(bytes(self._pending[: self.chunk_size])))
            del self._pending[: self.chunk_size]
        return out

    def finish(self, trailers: list[tuple[str, str]]) -> bytes:
        tail = unsigned_chunk(self._pending) if self._pending else b""
        self._pending.clear()
        return tail + unsigned_trailer_end(trailers)
