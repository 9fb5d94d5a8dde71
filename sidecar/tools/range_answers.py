"""What the answer to a ranged GET says of its body and of the whole object
(RFC 9110 section 14.4, Content-Range), as `sidecar replay` reads it: an answer
it cannot read is the endpoint failing (OriginUnavailable), never a traceback."""

from __future__ import annotations

import re

from sidecar.errors import OriginUnavailable

# RFC 9110 section 14.4: "bytes first-last/complete-length".
_CONTENT_RANGE = re.compile(r"bytes ([0-9]{1,20})-([0-9]{1,20})/([0-9]{1,20})")


def _content_range(content_range: str) -> tuple[int, int, int]:
    match = _CONTENT_RANGE.fullmatch(content_range.strip())
    if match is None:
        raise OriginUnavailable(f"the endpoint sent Content-Range: {content_range[:80]!r}, "
                                "not bytes FIRST-LAST/SIZE")
    first, last, size = (int(group) for group in match.groups())
    return first, last, size


def object_size(position: int, content_length: int, content_range: str | None) -> int:
    """Size of the whole object from the answer to `Range: bytes={position}-`."""
    if content_range:
        return _content_range(content_range)[2]
    if position:  # a 200 with the whole object: the range was ignored
        raise OriginUnavailable(f"the endpoint ignored Range: bytes={position}-")
    return content_length


def body_length(content_length: int | None, content_range: str | None) -> int:
    """Bytes the answer's body holds: its Content-Length, else (a body sent chunked
    or ended by the close) the range it says it is."""
    if content_length is not None:
        return content_length
    if content_range:
        first, last, _ = _content_range(content_range)
        return last - first + 1
    raise OriginUnavailable("the endpoint answered with neither Content-Length nor "
                            "Content-Range")
