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

The origin then no longer sees the chunk signatures, so the decoder checks them
when it is handed a SignatureChain (the sidecar knows the client's signing key
only when access keys are configured): each chunk's signature as its last byte
arrives, the final zero-length chunk's, and with `-TRAILER` the trailer's.
A broken chain raises SignatureRejected; the caller must not let the origin
receive the end of the body before the decoder is `done`.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass, field

from sidecar.s3.sigv4 import ChunkSigner, Reason, SignatureRejected

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


_SIGNATURE_EXTENSION = re.compile(rb"^chunk-signature=([0-9a-f]{64})$")
_TRAILER_SIGNATURE = "x-amz-trailer-signature"
_HMAC_STREAMING = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
_MISMATCH = "The request signature we calculated does not match the signature you provided."


def _mismatch(what: str) -> SignatureRejected:
    return SignatureRejected(Reason.BAD_SIGNATURE, f"{_MISMATCH} ({what})")


@dataclass
class SignatureChain:
    """The signatures of one signed aws-chunked body, each checked against the
    one before it (the first against the request's own, the ChunkSigner's seed)."""

    signer: ChunkSigner
    trailer_signed: bool  # STREAMING-...-PAYLOAD-TRAILER: the trailer is signed too
    _previous: str = field(init=False, repr=False)
    chunks: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._previous = self.signer.seed

    @classmethod
    def of(cls, signer: ChunkSigner, payload_hash: str) -> SignatureChain:
        """The chain of a body sent as `payload_hash` (a STREAMING-AWS4-* value)."""
        if not payload_hash.startswith(_HMAC_STREAMING):
            # SigV4a (ECDSA) chunk signatures under a SigV4 request signature
            # cannot be checked with an HMAC key, and S3 refuses the mix too.
            raise SignatureRejected(
                Reason.MALFORMED,
                "SigV4a (ECDSA) chunk signatures cannot follow a SigV4 request signature.",
            )
        return cls(signer, payload_hash.endswith("-TRAILER"))

    def chunk(self, claimed: bytes | None, data_sha256: str) -> None:
        self._previous = self._check(
            claimed, self.signer.chunk_signature(self._previous, data_sha256),
            f"chunk {self.chunks + 1}",
        )
        self.chunks += 1

    def trailer(self, claimed: bytes | None, lines: bytes) -> None:
        expected = self.signer.trailer_signature(self._previous, hashlib.sha256(lines).hexdigest())
        self._previous = self._check(claimed, expected, "trailer")

    @staticmethod
    def _check(claimed: bytes | None, expected: str, what: str) -> str:
        if claimed is None:
            raise _mismatch(f"{what} carries no signature")
        if not hmac.compare_digest(claimed, expected.encode("ascii")):
            raise _mismatch(what)
        return expected


@dataclass
class AwsChunkedDecoder:
    """Feed the encoded body in pieces of any size; get the payload bytes back.

    Memory is bounded by MAX_LINE plus the piece being fed: payload bytes are
    returned as slices of the input, never collected. With a `chain`, every
    signature is checked (SignatureRejected) before the decoder is `done`.
    """

    chain: SignatureChain | None = None
    _state: str = "header"  # header | data | data_end | trailer | done
    _line: bytearray = field(default_factory=bytearray)
    _remaining: int = 0
    decoded_bytes: int = 0
    trailers: list[tuple[str, str]] = field(default_factory=list)
    # The chain's state for the chunk being read: its claimed signature and the
    # running hash of its data; the trailer lines as sent (for their signature).
    _claimed: bytes | None = field(default=None, repr=False)
    _digest: hashlib._Hash | None = field(default=None, repr=False)
    _trailer_lines: bytearray = field(default_factory=bytearray, repr=False)
    _trailer_signed: bool = field(default=False, repr=False)

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
                if self._digest is not None:
                    self._digest.update(take)
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
                if self.chain is not None and self._digest is not None:
                    self.chain.chunk(self._claimed, self._digest.hexdigest())
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
        size_field, _, extension = line.partition(b";")
        size_field = size_field.strip()
        if not size_field or len(size_field) > _MAX_SIZE_DIGITS or \
                any(c not in b"0123456789abcdefABCDEF" for c in size_field):
            raise ChunkedFormatError(f"bad aws-chunked chunk header {line[:64]!r}")
        size = int(size_field, 16)
        if self.chain is not None:
            match = _SIGNATURE_EXTENSION.match(extension.strip())
            self._claimed = match.group(1) if match else None
            self._digest = hashlib.sha256()
        if size:
            self._remaining = size
            self._state = "data"
        else:
            # The final chunk is signed too: a body cut at a chunk boundary
            # lacks it, and never verifies.
            if self.chain is not None and self._digest is not None:
                self.chain.chunk(self._claimed, self._digest.hexdigest())
            self._state = "trailer"

    def _trailer_line(self, line: bytes) -> None:
        if not line:
            self._end_of_trailer()
            self._state = "done"
            return
        name, colon, value = line.decode("latin-1").partition(":")
        if not colon or not name.strip():
            raise ChunkedFormatError(f"bad aws-chunked trailer line {line[:64]!r}")
        if len(self.trailers) >= MAX_TRAILER_LINES:
            raise ChunkedFormatError("too many aws-chunked trailer lines")
        if self.chain is not None:
            self._signed_trailer_line(name.strip().lower(), value.strip(), line)
        self.trailers.append((name.strip().lower(), value.strip()))

    def _signed_trailer_line(self, name: str, value: str, line: bytes) -> None:
        assert self.chain is not None
        if self._trailer_signed:
            raise _mismatch("a trailer line follows the trailer signature")
        if name != _TRAILER_SIGNATURE:
            # sigv4-streaming-trailers.html: the trailer's string to sign holds
            # the hash of its lines, each ended by a newline.
            self._trailer_lines += line + b"\n"
            return
        if not self.chain.trailer_signed:
            raise _mismatch("a trailer signature in a body declared without one")
        self.chain.trailer(value.encode("latin-1"), bytes(self._trailer_lines))
        self._trailer_signed = True

    def _end_of_trailer(self) -> None:
        if self.chain is None:
            return
        if self.chain.trailer_signed and not self._trailer_signed:
            raise _mismatch("the trailer carries no signature")
        if not self.chain.trailer_signed and self._trailer_lines:
            raise _mismatch("trailer lines in a body declared without a signed trailer")


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
