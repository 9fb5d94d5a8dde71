from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.s3.ranges import (
    ByteRange,
    ByteRangeSpec,
    RangeResolution,
    ResolvedRange,
    parse_range,
    resolve_range,
    unsatisfied_content_range,
)

FULL = ResolvedRange(RangeResolution.FULL, None)
UNSATISFIABLE = ResolvedRange(RangeResolution.UNSATISFIABLE, None)


def partial(start: int, end: int) -> ResolvedRange:
    return ResolvedRange(RangeResolution.PARTIAL, ByteRange(start, end))


def resolve(header: str, size: int) -> ResolvedRange:
    return resolve_range(parse_range(header), size)


# --- parse_range -----------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("bytes=0-99", [ByteRangeSpec(0, 99, None)]),
        ("bytes=5-", [ByteRangeSpec(5, None, None)]),
        ("bytes=-7", [ByteRangeSpec(None, None, 7)]),
        ("bytes=-0", [ByteRangeSpec(None, None, 0)]),
        ("bytes=3-3", [ByteRangeSpec(3, 3, None)]),
        ("Bytes=0-1", [ByteRangeSpec(0, 1, None)]),
        ("BYTES=0-1", [ByteRangeSpec(0, 1, None)]),
        ("bytes=007-010", [ByteRangeSpec(7, 10, None)]),
        (
            "bytes=0-1, 4-5,\t-3",
            [
                ByteRangeSpec(0, 1, None),
                ByteRangeSpec(4, 5, None),
                ByteRangeSpec(None, None, 3),
            ],
        ),
        # Empty list elements are ignored (RFC 9110 §5.6.1.2).
        ("bytes=0-1,,2-3", [ByteRangeSpec(0, 1, None), ByteRangeSpec(2, 3, None)]),
        ("bytes=, 0-1 ,", [ByteRangeSpec(0, 1, None)]),
        ("  bytes=0-1  ", [ByteRangeSpec(0, 1, None)]),
        ("bytes=9999999999999999999-", [ByteRangeSpec(10**19 - 1, None, None)]),
    ],
)
def test_parse_range_valid(header: str, expected: list[ByteRangeSpec]) -> None:
    assert parse_range(header) == expected


@pytest.mark.parametrize(
    "header",
    [
        "",
        "bytes",
        "bytes=",
        "bytes= ",
        "bytes=,",
        "bytes=-",
        "bytes=5-2",
        "bytes=0-1,5-2",
        "items=0-1",
        "bytes =0-1",
        "bytes= 0 - 1",
        "bytes=+1-2",
        "bytes=-+5",
        "bytes=1--2",
        "bytes=--1",
        "bytes=0x1-2",
        "bytes=1-2-3",
        "bytes=1.0-2",
        "bytes=a-b",
        "bytes=\u0661-\u0662",  # Arabic-Indic digits are not DIGIT
        "bytes=0-1;2-3",
        "0-1",
        "bytes=10000000000000000000-",  # 20 digits
        "bytes=0-10000000000000000000",
        "bytes=-10000000000000000000",
        "bytes=00000000000000000001-2",  # 20 digits even if the value is small
    ],
)
def test_parse_range_invalid(header: str) -> None:
    assert parse_range(header) is None


# --- resolve_range: concrete cases ----------------------------------------


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        ("bytes=0-99", 1000, partial(0, 99)),
        ("bytes=0-0", 1000, partial(0, 0)),
        ("bytes=999-999", 1000, partial(999, 999)),  # last byte
        ("bytes=999-", 1000, partial(999, 999)),
        ("bytes=-1", 1000, partial(999, 999)),
        ("bytes=990-2000", 1000, partial(990, 999)),  # last-pos clamped
        ("bytes=0-", 1000, partial(0, 999)),  # whole object is still 206
        ("bytes=0-999", 1000, partial(0, 999)),
        ("bytes=-100", 1000, partial(900, 999)),
        ("bytes=-1000", 1000, partial(0, 999)),
        ("bytes=-5000", 1000, partial(0, 999)),  # suffix > size
        ("bytes=1000-", 1000, UNSATISFIABLE),  # past the end
        ("bytes=1000-1000", 1000, UNSATISFIABLE),
        ("bytes=5000-6000", 1000, UNSATISFIABLE),
        ("bytes=-0", 1000, UNSATISFIABLE),  # suffix 0
        ("bytes=0-0", 0, UNSATISFIABLE),  # zero-size object
        ("bytes=0-", 0, UNSATISFIABLE),
        # RFC 9110 §14.1.1: a non-zero suffix is satisfiable; an empty object
        # has no byte to select, so it is answered whole (200), as S3 does.
        ("bytes=-1", 0, FULL),
        ("bytes=-10", 0, FULL),
        ("bytes=-0", 0, UNSATISFIABLE),
        ("bytes=0-0", 1, partial(0, 0)),
        ("bytes=-9999999999999999999", 10, partial(0, 9)),
        ("bytes=0-1,5-6", 1000, FULL),  # multi-range: S3 ignores the header
        ("bytes=0-1,5000-6000", 1000, FULL),
        ("bytes=0-1,2-3", 0, FULL),
        ("bytes=5-2", 1000, FULL),  # invalid: ignored
        ("bytes=", 1000, FULL),
        ("items=0-1", 1000, FULL),
    ],
)
def test_resolve_range(header: str, size: int, expected: ResolvedRange) -> None:
    assert resolve(header, size) == expected


def test_resolve_none_and_empty_are_full() -> None:
    assert resolve_range(None, 10) == FULL
    assert resolve_range([], 10) == FULL


def test_resolve_negative_size_rejected() -> None:
    with pytest.raises(ValueError):
        resolve_range([ByteRangeSpec(0, 1, None)], -1)


def test_byte_range_length_and_content_range() -> None:
    r = ByteRange(0, 99)
    assert r.length == 100
    assert r.content_range(1000) == "bytes 0-99/1000"
    assert ByteRange(999, 999).length == 1
    assert ByteRange(999, 999).content_range(1000) == "bytes 999-999/1000"


def test_unsatisfied_content_range() -> None:
    assert unsatisfied_content_range(1000) == "bytes */1000"
    assert unsatisfied_content_range(0) == "bytes */0"


# --- properties ----------------------------------------------------------

sizes = st.integers(min_value=0, max_value=5000)
positions = st.integers(min_value=0, max_value=6000)


@st.composite
def specs(draw: st.DrawFn) -> ByteRangeSpec:
    kind = draw(st.sampled_from(["closed", "open", "suffix"]))
    if kind == "suffix":
        return ByteRangeSpec(None, None, draw(positions))
    first = draw(positions)
    if kind == "open":
        return ByteRangeSpec(first, None, None)
    return ByteRangeSpec(first, first + draw(positions), None)


def spec_text(spec: ByteRangeSpec) -> str:
    if spec.suffix is not None:
        return f"-{spec.suffix}"
    return f"{spec.first}-{'' if spec.last is None else spec.last}"


def expected_slice(spec: ByteRangeSpec, size: int) -> tuple[int, int]:
    """The Python slice a satisfiable spec denotes, as an independent oracle."""
    if spec.suffix is not None:
        return max(size - spec.suffix, 0), size
    assert spec.first is not None
    stop = size if spec.last is None else min(spec.last + 1, size)
    return spec.first, stop


@given(spec=specs())
def test_parse_round_trips_spec(spec: ByteRangeSpec) -> None:
    assert parse_range(f"bytes={spec_text(spec)}") == [spec]


@given(spec=specs(), size=sizes)
def test_partial_selects_python_slice(spec: ByteRangeSpec, size: int) -> None:
    data = bytes(i % 251 for i in range(size))
    resolved = resolve_range([spec], size)
    lo, hi = expected_slice(spec, size)
    if size == 0 and spec.suffix:
        # A non-zero suffix of an empty object: the whole (empty) object.
        assert resolved.kind is RangeResolution.FULL
        return
    if resolved.kind is RangeResolution.UNSATISFIABLE:
        # Unsatisfiable exactly when the slice would be empty.
        assert data[lo:hi] == b""
        assert resolved.range is None
        return
    assert resolved.kind is RangeResolution.PARTIAL
    r = resolved.range
    assert r is not None
    assert 0 <= r.start <= r.end < size
    selected = data[r.start : r.end + 1]
    assert len(selected) == r.length
    assert selected == data[lo:hi]
    assert selected != b""


@given(a=positions, extra=positions, size=sizes)
def test_closed_range_bytes(a: int, extra: int, size: int) -> None:
    b = a + extra
    data = bytes(i % 256 for i in range(size))
    resolved = resolve(f"bytes={a}-{b}", size)
    if a >= size:
        assert resolved == UNSATISFIABLE
        return
    assert resolved.range is not None
    r = resolved.range
    assert data[r.start : r.end + 1] == data[a : min(b, size - 1) + 1]
    assert r.content_range(size) == f"bytes {a}-{min(b, size - 1)}/{size}"


@given(st.lists(specs(), min_size=2, max_size=5), sizes)
def test_multi_range_always_full(many: list[ByteRangeSpec], size: int) -> None:
    header = "bytes=" + ", ".join(spec_text(s) for s in many)
    assert parse_range(header) == many
    assert resolve(header, size) == FULL


range_ish = st.text(alphabet="0123456789-, \t=", max_size=30).map("bytes=".__add__)


@given(st.one_of(st.text(max_size=40), range_ish))
def test_parse_never_raises(text: str) -> None:
    result = parse_range(text)
    assert result is None or len(result) >= 1
    if result is not None:
        for spec in result:
            assert (spec.suffix is None) == (spec.first is not None)
