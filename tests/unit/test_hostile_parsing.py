"""Properties of the request parsers under hostile input: they decide, never crash.

Whatever a client puts in the path, Range and conditional headers, the data
port's pure parsing either answers with a decision or an S3 error; an object
address it accepts is one S3 could hold, and never a traversal.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.s3.addressing import MAX_KEY_BYTES, split_path, validate_object_address
from sidecar.s3.errors import S3Error
from sidecar.s3.preconditions import ReadOutcome, RequestHeaders, decide_read

_HOSTILE = settings(max_examples=400, deadline=None, derandomize=True)

_header_text = st.one_of(
    st.none(),
    st.text(max_size=60),
    st.from_regex(r"\Abytes=[0-9,\- ]{0,30}\Z"),
    st.sampled_from(['"abc"', "*", 'W/"abc"', '"abc", W/"x"', "Sun, 06 Nov 1994 08:49:37 GMT",
                     "Sunday, 06-Nov-94 08:49:37 GMT", "Fri, 31 Dec 9999 23:59:59 GMT",
                     "bytes=99999999999999999999-", "bytes=-0", "bytes=5-1"]),
)


@_HOSTILE
@given(
    st.builds(RequestHeaders, range=_header_text, if_match=_header_text,
              if_none_match=_header_text, if_modified_since=_header_text,
              if_unmodified_since=_header_text, if_range=_header_text),
    st.integers(min_value=0, max_value=2**40),
    st.sampled_from(['"abc"', 'W/"abc"', "abc", '"a,b"']),
    st.datetimes(min_value=datetime(1970, 1, 2), max_value=datetime(9998, 1, 1),
                 timezones=st.just(UTC)),
)
def test_decide_read_always_decides_within_the_object(
    headers: RequestHeaders, size: int, etag: str, last_modified: datetime
) -> None:
    decision = decide_read(headers, size=size, etag=etag, last_modified=last_modified,
                           now=last_modified + timedelta(days=1))
    assert decision.outcome in ReadOutcome
    if decision.outcome is ReadOutcome.PARTIAL:
        assert decision.range is not None
        assert 0 <= decision.range.start <= decision.range.end < size


_path_piece = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["%00", "%2e%2e", "%2E", "..", ".", "%2f", "%ff", "%c0%af", "%", "%zz",
                     "\\", "//", "%0a", "~", "%7e", "k" * 1100]),
)


@_HOSTILE
@given(st.lists(_path_piece, max_size=8), st.text(max_size=20))
def test_accepted_object_addresses_are_never_traversals(pieces: list[str], query: str) -> None:
    raw = "/" + "/".join(pieces) + ("?" + query if query else "")
    try:
        bucket, key, _ = split_path(raw)
        if not bucket or not key:
            return
        validate_object_address(bucket, key)
    except S3Error as exc:
        assert 400 <= exc.status < 500
        return
    # What is accepted is an S3 object address: a valid bucket name and a key
    # of at most 1024 bytes without control characters or dot segments. Keys
    # are only ever cache index entries and origin request paths, never files.
    assert "/" not in bucket and ".." not in bucket
    assert len(key.encode("utf-8")) <= MAX_KEY_BYTES
    assert not any(segment in (".", "..") for segment in key.split("/"))
    assert not any(ord(char) < 0x20 and char not in "\t\n\r" for char in key)
