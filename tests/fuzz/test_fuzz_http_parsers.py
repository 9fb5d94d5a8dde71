"""Fuzzing the Range and precondition parsers (sidecar.s3.ranges, .preconditions).

No input crashes them: parse_range answers specs or None, decide_read a
decision. None gets past them wrongly: a partial answer lies inside the
object, and a number that is not ASCII digits is never read as one.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.s3.preconditions import ReadOutcome, RequestHeaders, decide_read
from sidecar.s3.ranges import RangeResolution, parse_range, resolve_range
from tests.support.fuzz_corpus import text_seeds

RANGES = text_seeds("range")
PRECONDITIONS = text_seeds("precondition")
MODIFIED = datetime(2026, 11, 1, 12, 0, 0, tzinfo=UTC)
# What a mutation splices in: the grammar's own characters, and the look-alikes.
PIECES = st.sampled_from(["bytes=", "-", ",", " ", "\t", "0", "1", "9" * 20, "\u00b2",
                          "\u0661", "\uff11", "_", "+", '"', "W/", "*", "GMT", "\r\n", "\x00"])


def mutated(seeds: list[str]) -> st.SearchStrategy[str]:
    """A seed with pieces inserted, deleted or replaced; or any text at all."""
    def mutate(seed: str, edits: list[tuple[int, int, str]]) -> str:
        text = seed
        for at, drop, piece in edits:
            at %= len(text) + 1
            text = text[:at] + piece + text[at + drop:]
        return text
    edit = st.tuples(st.integers(0, 200), st.integers(0, 3), PIECES | st.text(max_size=4))
    return st.one_of(
        st.builds(mutate, st.sampled_from(seeds), st.lists(edit, max_size=4)),
        st.text(max_size=64),
    )


def check_range(value: str, size: int) -> None:
    specs = parse_range(value)
    if specs is None:
        return
    for spec in specs:
        numbers = [n for n in (spec.first, spec.last, spec.suffix) if n is not None]
        assert all(0 <= n < 10**19 for n in numbers)
    # Every digit it read was an ASCII one: no other digit is a number here.
    assert not any(c.isdigit() and not c.isascii() for c in value)
    resolved = resolve_range(specs, size)
    if resolved.kind is RangeResolution.PARTIAL:
        assert resolved.range is not None
        assert 0 <= resolved.range.start <= resolved.range.end < size


@pytest.mark.parametrize("value", RANGES)
def test_range_corpus(value: str) -> None:
    for size in (0, 1, 100, 2**63 - 1):
        check_range(value, size)


@given(mutated(RANGES), st.integers(0, 2**63 - 1))
def test_range_parser(value: str, size: int) -> None:
    check_range(value, size)


def check_decision(headers: RequestHeaders, size: int) -> None:
    decision = decide_read(headers, size=size, etag='"e1"', last_modified=MODIFIED,
                           now=MODIFIED + timedelta(days=1))
    assert isinstance(decision.outcome, ReadOutcome)
    if decision.outcome is ReadOutcome.PARTIAL:
        assert decision.range is not None and 0 <= decision.range.start <= decision.range.end
        assert decision.range.end < size
    if decision.outcome is ReadOutcome.NOT_MODIFIED:
        # Only a condition that was sent can make the answer a 304.
        assert headers.if_none_match is not None or headers.if_modified_since is not None
    if decision.outcome is ReadOutcome.PRECONDITION_FAILED:
        assert headers.if_match is not None or headers.if_unmodified_since is not None


@pytest.mark.parametrize("value", PRECONDITIONS)
def test_precondition_corpus(value: str) -> None:
    for field in ("if_match", "if_none_match", "if_modified_since", "if_unmodified_since",
                  "if_range"):
        check_decision(RequestHeaders(range="bytes=0-9", **{field: value}), 100)


OPTIONAL = st.none() | mutated(PRECONDITIONS)


@given(st.builds(RequestHeaders, range=st.none() | mutated(RANGES), if_match=OPTIONAL,
                 if_none_match=OPTIONAL, if_modified_since=OPTIONAL,
                 if_unmodified_since=OPTIONAL, if_range=OPTIONAL),
       st.integers(0, 2**40))
def test_precondition_parser(headers: RequestHeaders, size: int) -> None:
    check_decision(headers, size)
