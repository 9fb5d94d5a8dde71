from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.s3.preconditions import (
    ReadDecision,
    ReadOutcome,
    RequestHeaders,
    decide_read,
    http_date,
)
from sidecar.s3.ranges import ByteRange

SIZE = 1000
ETAG = '"abc"'
LAST_MODIFIED = datetime(1994, 11, 6, 8, 49, 37, tzinfo=UTC)
LM_TEXT = "Sun, 06 Nov 1994 08:49:37 GMT"
EARLIER = "Sun, 06 Nov 1994 08:49:36 GMT"
LATER = "Sun, 06 Nov 1994 08:49:38 GMT"
# The server's clock, handed in: a day after the object was written.
NOW = LAST_MODIFIED + timedelta(days=1)

FULL = ReadDecision(ReadOutcome.FULL, None)
NOT_MODIFIED = ReadDecision(ReadOutcome.NOT_MODIFIED, None)
FAILED = ReadDecision(ReadOutcome.PRECONDITION_FAILED, None)
UNSATISFIABLE = ReadDecision(ReadOutcome.NOT_SATISFIABLE, None)
FIRST_TEN = ReadDecision(ReadOutcome.PARTIAL, ByteRange(0, 9))


def decide(
    etag: str = ETAG, last_modified: datetime = LAST_MODIFIED, now: datetime = NOW,
    **headers: str | None,
) -> ReadDecision:
    return decide_read(
        RequestHeaders(**headers), size=SIZE, etag=etag, last_modified=last_modified, now=now
    )


def test_no_headers_is_full() -> None:
    assert decide() == FULL


def test_range_alone() -> None:
    assert decide(range="bytes=0-9") == FIRST_TEN
    assert decide(range="bytes=-1") == ReadDecision(
        ReadOutcome.PARTIAL, ByteRange(999, 999)
    )
    assert decide(range="bytes=1000-") == UNSATISFIABLE
    assert decide(range="bytes=5-2") == FULL
    assert decide(range="bytes=0-1,3-4") == FULL


# --- If-Match (RFC 9110 §13.1.1) -------------------------------------------


@pytest.mark.parametrize(
    ("if_match", "expected"),
    [
        ('"abc"', FULL),
        ("*", FULL),
        (" * ", FULL),
        ('"x", "abc"', FULL),
        ('"x","abc"', FULL),
        ('"x" ,\t"abc" ', FULL),
        ('"a,b", "abc"', FULL),
        ('"x"', FAILED),
        ('W/"abc"', FAILED),  # weak tags never match strongly
        ('"ABC"', FAILED),  # opaque-tags compare case-sensitively
        ("abc", FULL),  # S3 takes an unquoted ETag as the quoted one
        ('"x", abc', FULL),
        ("abcd", FAILED),
        ('a"bc', FAILED),  # neither quoted nor a bare tag: dropped
        ('"abc,x"', FAILED),
        ("", FAILED),  # an empty list matches nothing
        ('*, "abc"', FULL),
    ],
)
def test_if_match(if_match: str, expected: ReadDecision) -> None:
    assert decide(if_match=if_match) == expected


def test_if_match_quoted_comma_in_current_etag() -> None:
    assert decide(etag='"a,b"', if_match='"x", "a,b"') == FULL
    assert decide(etag='"a,b"', if_match='"a", "b"') == FAILED


def test_if_match_against_weak_origin_etag_fails() -> None:
    assert decide(etag='W/"abc"', if_match='W/"abc"') == FAILED
    assert decide(etag='W/"abc"', if_match="*") == FULL


def test_unquoted_origin_etag_is_tolerated() -> None:
    assert decide(etag="abc", if_match='"abc"') == FULL
    assert decide(etag="abc", if_none_match='"abc"') == NOT_MODIFIED


# --- If-Unmodified-Since (§13.1.4) -------------------------------------------


@pytest.mark.parametrize(
    ("date", "expected"),
    [
        (LM_TEXT, FULL),  # equal: not modified since
        (LATER, FULL),
        (EARLIER, FAILED),
        ("not a date", FULL),  # invalid: ignored
        ("", FULL),
        (f"{EARLIER}, {LATER}", FULL),  # a list of dates is ignored
        ("Sunday, 06-Nov-94 08:49:36 GMT", FAILED),  # obsolete RFC 850 form
        ("Sun Nov  6 08:49:36 1994", FAILED),  # obsolete asctime form
        ("Sun, 06 Nov 1994 09:49:36 +0100", FAILED),  # same instant, other zone
        ("Sun, 31 Feb 1994 08:49:36 GMT", FULL),
        ("Sun, 06 Nov 99999999999 08:49:36 GMT", FULL),
    ],
)
def test_if_unmodified_since(date: str, expected: ReadDecision) -> None:
    assert decide(if_unmodified_since=date) == expected


def test_a_failed_precondition_names_its_header() -> None:
    # S3's PreconditionFailed error carries <Condition> with the header's name.
    assert decide(if_match='"x"').condition == "If-Match"
    assert decide(if_unmodified_since=EARLIER).condition == "If-Unmodified-Since"
    assert decide(if_match='"x"', if_unmodified_since=EARLIER).condition == "If-Match"


def test_if_unmodified_since_ignored_when_if_match_present() -> None:
    assert decide(if_match='"abc"', if_unmodified_since=EARLIER) == FULL
    assert decide(if_match='"x"', if_unmodified_since=LATER) == FAILED


# --- If-None-Match (§13.1.2) -------------------------------------------------


@pytest.mark.parametrize(
    ("if_none_match", "expected"),
    [
        ('"abc"', NOT_MODIFIED),
        ('W/"abc"', NOT_MODIFIED),  # weak comparison
        ("*", NOT_MODIFIED),
        ('"x", W/"abc"', NOT_MODIFIED),
        ('"a,b"', FULL),
        ('"x"', FULL),
        ("abc", NOT_MODIFIED),  # S3 takes an unquoted ETag as the quoted one
        ("x, abc", NOT_MODIFIED),
        ("abcd", FULL),
        ("", FULL),
    ],
)
def test_if_none_match(if_none_match: str, expected: ReadDecision) -> None:
    assert decide(if_none_match=if_none_match) == expected


def test_if_none_match_weak_origin_etag() -> None:
    assert decide(etag='W/"abc"', if_none_match='"abc"') == NOT_MODIFIED


# --- If-Modified-Since (§13.1.3) ---------------------------------------------


@pytest.mark.parametrize(
    ("date", "expected"),
    [
        (LM_TEXT, NOT_MODIFIED),
        (LATER, NOT_MODIFIED),
        (EARLIER, FULL),
        ("garbage", FULL),
        (f"{LATER}, {LATER}", FULL),
        ("Sun Nov  6 08:49:37 1994", NOT_MODIFIED),
    ],
)
def test_if_modified_since(date: str, expected: ReadDecision) -> None:
    assert decide(if_modified_since=date) == expected


def test_a_future_if_modified_since_is_ignored() -> None:
    """A date later than the server's clock is no Last-Modified it sent: the
    GET answers 200 with the object, as S3 does (RFC 2616 §14.25; RFC 9110
    §13.1.3 reads the date on the server's clock)."""
    ahead = http_date(NOW + timedelta(seconds=1))
    assert decide(if_modified_since=ahead) == FULL
    assert decide(if_modified_since=ahead, range="bytes=0-9") == FIRST_TEN
    assert decide(if_modified_since=http_date(NOW + timedelta(days=3650))) == FULL
    # The server's current second itself is not in the future.
    assert decide(if_modified_since=http_date(NOW)) == NOT_MODIFIED
    assert decide(now=NOW + timedelta(microseconds=999_999),
                  if_modified_since=http_date(NOW)) == NOT_MODIFIED


def test_if_modified_since_ignored_when_if_none_match_present() -> None:
    assert decide(if_none_match='"x"', if_modified_since=LATER) == FULL
    assert decide(if_none_match='"abc"', if_modified_since=EARLIER) == NOT_MODIFIED


def test_sub_second_last_modified_compares_at_second_resolution() -> None:
    precise = LAST_MODIFIED + timedelta(microseconds=500_000)
    assert decide(last_modified=precise, if_modified_since=LM_TEXT) == NOT_MODIFIED
    assert decide(last_modified=precise, if_unmodified_since=LM_TEXT) == FULL
    assert (
        decide(last_modified=precise, range="bytes=0-9", if_range=LM_TEXT) == FIRST_TEN
    )


# --- If-Range (§13.1.5) ------------------------------------------------------


@pytest.mark.parametrize(
    ("if_range", "expected"),
    [
        ('"abc"', FIRST_TEN),
        (' "abc" ', FIRST_TEN),
        ('W/"abc"', FULL),  # weak tags never satisfy If-Range
        ('"x"', FULL),
        (LM_TEXT, FIRST_TEN),  # date equality
        ("Sun, 06 Nov 1994 09:49:37 +0100", FIRST_TEN),
        (EARLIER, FULL),  # not equal: even an earlier date fails
        (LATER, FULL),
        ("garbage", FULL),
        ("", FULL),
    ],
)
def test_if_range(if_range: str, expected: ReadDecision) -> None:
    assert decide(range="bytes=0-9", if_range=if_range) == expected


def test_if_range_without_range_is_ignored() -> None:
    assert decide(if_range='"x"') == FULL
    assert decide(if_range='"abc"') == FULL


def test_if_range_match_then_unsatisfiable_range() -> None:
    assert decide(range="bytes=5000-", if_range='"abc"') == UNSATISFIABLE
    assert decide(range="bytes=5000-", if_range='"x"') == FULL


# --- evaluation order (§13.2.2) ----------------------------------------------


def test_if_match_failure_wins_over_everything() -> None:
    assert decide(if_match='"x"', if_none_match='"abc"', range="bytes=0-9") == FAILED


def test_not_modified_wins_over_range() -> None:
    assert decide(if_none_match='"abc"', range="bytes=5000-") == NOT_MODIFIED
    assert decide(if_modified_since=LATER, range="bytes=0-9") == NOT_MODIFIED


def test_all_preconditions_pass_then_range() -> None:
    decision = decide(
        if_match='"abc"',
        if_none_match='"x"',
        if_modified_since=EARLIER,
        range="bytes=0-9",
        if_range=LM_TEXT,
    )
    assert decision == FIRST_TEN


def test_naive_last_modified_rejected() -> None:
    with pytest.raises(ValueError):
        decide(last_modified=datetime(1994, 11, 6, 8, 49, 37))


# --- http_date (§5.6.7) ------------------------------------------------------


def test_http_date_formats_imf_fixdate() -> None:
    assert http_date(LAST_MODIFIED) == LM_TEXT
    assert http_date(datetime(2024, 3, 1, 0, 0, 5, 999_999, tzinfo=UTC)) == (
        "Fri, 01 Mar 2024 00:00:05 GMT"
    )
    plus_two = timezone(timedelta(hours=2))
    assert http_date(datetime(2024, 3, 1, 2, 0, 0, tzinfo=plus_two)) == (
        "Fri, 01 Mar 2024 00:00:00 GMT"
    )


def test_http_date_rejects_naive() -> None:
    with pytest.raises(ValueError):
        http_date(datetime(2024, 3, 1))


# --- properties ----------------------------------------------------------

instants = st.datetimes(
    min_value=datetime(1970, 1, 1), max_value=datetime(9999, 1, 1)
).map(lambda d: d.replace(tzinfo=UTC))
# etagc = %x21 / %x23-7E: includes commas, excludes DQUOTE and spaces.
opaque = st.text(
    alphabet=st.characters(
        min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"'
    ),
    max_size=12,
)


@given(instants)
def test_own_last_modified_round_trips(lm: datetime) -> None:
    echoed = http_date(lm)
    # The server's clock reads at least the Last-Modified it gives out.
    assert decide(last_modified=lm, now=lm, if_modified_since=echoed) == NOT_MODIFIED
    assert decide(last_modified=lm, if_unmodified_since=echoed) == FULL
    assert decide(last_modified=lm, range="bytes=0-9", if_range=echoed) == FIRST_TEN


@given(instants, st.integers(min_value=1, max_value=10**6))
def test_one_second_newer_is_modified(lm: datetime, seconds: int) -> None:
    older = http_date(lm - timedelta(seconds=seconds))
    assert decide(last_modified=lm, if_modified_since=older) == FULL
    assert decide(last_modified=lm, if_unmodified_since=older) == FAILED
    assert decide(last_modified=lm, range="bytes=0-9", if_range=older) == FULL


@given(opaque, st.lists(opaque, max_size=4), st.integers(min_value=0, max_value=4))
def test_tag_lists_with_commas(current: str, others: list[str], at: int) -> None:
    others = [o for o in others if o != current]
    etag = f'"{current}"'
    tags = [f'"{o}"' for o in others]
    assert decide(etag=etag, if_none_match=" , ".join(tags)) == FULL
    assert decide(etag=etag, if_match=",".join(tags)) == FAILED
    tags.insert(min(at, len(tags)), etag)
    assert decide(etag=etag, if_none_match=" , ".join(tags)) == NOT_MODIFIED
    assert decide(etag=etag, if_match=",".join(tags)) == FULL
    weak = [f"W/{t}" for t in tags]
    assert decide(etag=etag, if_match=", ".join(weak)) == FAILED
    assert decide(etag=etag, if_none_match=", ".join(weak)) == NOT_MODIFIED


@given(st.text(max_size=40), st.text(max_size=40), st.text(max_size=40))
def test_arbitrary_headers_never_raise(a: str, b: str, c: str) -> None:
    decision = decide(
        if_match=a or None,
        if_none_match=b or None,
        if_modified_since=c,
        if_unmodified_since=a,
        if_range=b,
        range=c,
    )
    assert isinstance(decision.outcome, ReadOutcome)
    assert (decision.range is not None) == (decision.outcome is ReadOutcome.PARTIAL)
