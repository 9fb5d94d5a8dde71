"""Range request parsing and resolution (RFC 9110 §14), shaped after Amazon S3.

Parsing is strict about syntax and returns None for anything it does not
understand: RFC 9110 §14.2 lets a server ignore an invalid Range header, and
S3 does exactly that (200 with the whole object), so "invalid" and "absent"
are the same thing to callers.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

# Twenty digits can exceed a signed 64-bit length; nothing real is that large,
# and capping the digit count bounds the work a hostile header can cause.
_MAX_DIGITS = 19
_NUMBER = rf"[0-9]{{1,{_MAX_DIGITS}}}"
_SPEC = re.compile(rf"(?P<first>{_NUMBER})?-(?P<last>{_NUMBER})?")
# OWS is SP / HTAB only (RFC 9110 §5.6.3); str.strip() would eat more.
_OWS = " \t"


@dataclass(frozen=True)
class ByteRangeSpec:
    """One range-spec as written in the header, not yet resolved against a size."""

    first: int | None
    last: int | None
    suffix: int | None


@dataclass(frozen=True)
class ByteRange:
    """A satisfiable range within a representation; ``end`` is inclusive."""

    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start + 1

    def content_range(self, size: int) -> str:
        # RFC 9110 §14.4: complete-length is the size of the whole representation.
        return f"bytes {self.start}-{self.end}/{size}"


class RangeResolution(enum.Enum):
    FULL = "full"
    PARTIAL = "partial"
    UNSATISFIABLE = "unsatisfiable"


@dataclass(frozen=True)
class ResolvedRange:
    kind: RangeResolution
    range: ByteRange | None = None


def parse_range(value: str) -> list[ByteRangeSpec] | None:
    """Parse a Range header value; None when invalid or not in the bytes unit."""
    unit, sep, range_set = value.strip(_OWS).partition("=")
    # Range units are case-insensitive (RFC 9110 §14.1).
    if not sep or unit.lower() != "bytes":
        return None
    specs: list[ByteRangeSpec] = []
    for element in range_set.split(","):
        element = element.strip(_OWS)
        # RFC 9110 §5.6.1.2: empty list elements are ignored, not errors.
        if not element:
            continue
        spec = _parse_spec(element)
        if spec is None:
            return None
        specs.append(spec)
    # The range-set is 1#range-spec: at least one non-empty element.
    return specs or None


def _parse_spec(text: str) -> ByteRangeSpec | None:
    match = _SPEC.fullmatch(text)
    if match is None:
        return None
    first_text, last_text = match["first"], match["last"]
    if first_text is None:
        if last_text is None:
            return None
        return ByteRangeSpec(first=None, last=None, suffix=int(last_text))
    first = int(first_text)
    last = None if last_text is None else int(last_text)
    # RFC 9110 §14.1.1: an int-range with last-pos < first-pos is invalid.
    if last is not None and last < first:
        return None
    return ByteRangeSpec(first=first, last=last, suffix=None)


def resolve_range(specs: list[ByteRangeSpec] | None, size: int) -> ResolvedRange:
    """What a parsed Range header selects from a representation of ``size`` bytes."""
    if size < 0:
        raise ValueError(f"size must be non-negative, got {size}")
    # S3 does not implement multipart/byteranges; it ignores a multi-range
    # header and serves the whole object, which §14.2 permits.
    if not specs or len(specs) > 1:
        return ResolvedRange(RangeResolution.FULL)
    spec = specs[0]
    if size == 0 and spec.suffix:
        # RFC 9110 §14.1.1: a suffix-range of non-zero length is satisfiable
        # whatever the representation's length, yet selects no byte of an empty
        # one: S3 answers 200 with the (empty) object, and so does the sidecar.
        return ResolvedRange(RangeResolution.FULL)
    resolved = _resolve_spec(spec, size)
    if resolved is None:
        return ResolvedRange(RangeResolution.UNSATISFIABLE)
    return ResolvedRange(RangeResolution.PARTIAL, resolved)


def _resolve_spec(spec: ByteRangeSpec, size: int) -> ByteRange | None:
    # RFC 9110 §14.1.1: no int-range of a zero-length representation is
    # satisfiable (a suffix-range of one is answered whole: resolve_range).
    if size == 0:
        return None
    if spec.suffix is not None:
        if spec.suffix == 0:
            return None
        # A suffix longer than the representation selects all of it.
        return ByteRange(max(size - spec.suffix, 0), size - 1)
    if spec.first is None or spec.first >= size:
        return None
    # A last-pos past the end is clamped, not an error (§14.1.1).
    last = size - 1 if spec.last is None else min(spec.last, size - 1)
    return ByteRange(spec.first, last)


def unsatisfied_content_range(size: int) -> str:
    """Content-Range for a 416 response (RFC 9110 §14.4, unsatisfied-range)."""
    return f"bytes */{size}"
