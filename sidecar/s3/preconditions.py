"""Conditional GET/HEAD evaluation (RFC 9110 §13), decided before any byte is read.

The caller supplies the origin's validators (size, ETag, Last-Modified) and the
request's raw headers; ``decide_read`` returns what the response must be, so
serving code only has to act on one outcome.
"""

from __future__ import annotations

import enum
import functools
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import format_datetime, parsedate_to_datetime

from sidecar.s3.ranges import ByteRange, RangeResolution, parse_range, resolve_range

# entity-tag = [ weak ] opaque-tag (RFC 9110 §8.8.3); "W/" is case-sensitive.
# The opaque part is taken loosely (anything but DQUOTE): being stricter would
# only turn odd-but-harmless tags into mismatches.
_ENTITY_TAG = re.compile(r'(?P<weak>W/)?"(?P<opaque>[^"]*)"')
_OWS = " \t"
# S3 takes If-Match/If-None-Match values with or without the quotes (the aws
# cli and boto3 hand them over as typed, and many callers strip the quotes
# from the ETag they got back), so a bare run of etagc characters is read as
# the strong tag it names rather than dropped as malformed.
_BARE_TAG = re.compile(r"[\x21\x23-\x7e\x80-\xff]+")


class ReadOutcome(enum.Enum):
    FULL = "full"  # 200
    PARTIAL = "partial"  # 206
    NOT_SATISFIABLE = "not_satisfiable"  # 416
    NOT_MODIFIED = "not_modified"  # 304
    PRECONDITION_FAILED = "precondition_failed"  # 412


@dataclass(frozen=True)
class RequestHeaders:
    range: str | None = None
    if_match: str | None = None
    if_none_match: str | None = None
    if_modified_since: str | None = None
    if_unmodified_since: str | None = None
    if_range: str | None = None


@dataclass(frozen=True)
class ReadDecision:
    outcome: ReadOutcome
    range: ByteRange | None = None
    # The header whose condition failed, for a 412: S3 names it in the error's
    # <Condition>. Not part of the outcome, so decisions compare without it.
    condition: str | None = field(default=None, compare=False)


@dataclass(frozen=True)
class _EntityTag:
    weak: bool
    opaque: str


def decide_read(
    headers: RequestHeaders, *, size: int, etag: str, last_modified: datetime, now: datetime
) -> ReadDecision:
    """Evaluate preconditions, If-Range and Range in the order of RFC 9110 §13.2.2.

    ``now`` is the server's current time (aware), against which an
    If-Modified-Since date is read.
    """
    current = _origin_tag(etag)
    modified = _to_second(last_modified)
    if headers.if_match is not None:
        if not _if_match_passes(headers.if_match, current):
            return ReadDecision(ReadOutcome.PRECONDITION_FAILED, condition="If-Match")
    elif (since := _parse_http_date(headers.if_unmodified_since)) is not None and modified > since:
        return ReadDecision(ReadOutcome.PRECONDITION_FAILED, condition="If-Unmodified-Since")
    if headers.if_none_match is not None:
        # For GET/HEAD a false If-None-Match is a 304, never a 412 (§13.1.2).
        if _if_none_match_matches(headers.if_none_match, current):
            return ReadDecision(ReadOutcome.NOT_MODIFIED)
    elif (since := _modified_since(headers.if_modified_since, now)) is not None \
            and modified <= since:
        return ReadDecision(ReadOutcome.NOT_MODIFIED)
    if headers.range is None:
        return ReadDecision(ReadOutcome.FULL)
    if headers.if_range is not None and not _if_range_passes(
        headers.if_range, current, modified
    ):
        # §13.1.5: a failed If-Range means "send me the whole new thing".
        return ReadDecision(ReadOutcome.FULL)
    return _decide_range(headers.range, size)


@functools.lru_cache(maxsize=4096)
def http_date(dt: datetime) -> str:
    """Format ``dt`` as an IMF-fixdate (RFC 9110 §5.6.7), e.g. for Last-Modified.
    Remembered: a replay answers thousands of ranges of the same few objects."""
    return format_datetime(_to_second(dt), usegmt=True)


def _decide_range(value: str, size: int) -> ReadDecision:
    resolved = resolve_range(parse_range(value), size)
    if resolved.kind is RangeResolution.PARTIAL:
        return ReadDecision(ReadOutcome.PARTIAL, resolved.range)
    if resolved.kind is RangeResolution.UNSATISFIABLE:
        return ReadDecision(ReadOutcome.NOT_SATISFIABLE)
    return ReadDecision(ReadOutcome.FULL)


def _if_match_passes(value: str, current: _EntityTag) -> bool:
    # "*" passes whenever a current representation exists, which it does here.
    if value.strip(_OWS) == "*":
        return True
    return any(_strong_match(tag, current) for tag in _parse_tag_list(value))


def _if_none_match_matches(value: str, current: _EntityTag) -> bool:
    if value.strip(_OWS) == "*":
        return True
    return any(_weak_match(tag, current) for tag in _parse_tag_list(value))


def _if_range_passes(value: str, current: _EntityTag, modified: datetime) -> bool:
    value = value.strip(_OWS)
    tag = _parse_tag(value)
    if tag is not None:
        return _strong_match(tag, current)
    # A date validator must equal Last-Modified exactly; anything unparseable
    # cannot be shown to match, so the Range is ignored.
    date = _parse_http_date(value)
    return date is not None and date == modified


def _strong_match(a: _EntityTag, b: _EntityTag) -> bool:
    # §8.8.3.2: both strong and character-for-character identical.
    return not a.weak and not b.weak and a.opaque == b.opaque


def _weak_match(a: _EntityTag, b: _EntityTag) -> bool:
    return a.opaque == b.opaque


def _parse_tag_list(value: str) -> list[_EntityTag]:
    """Entity tags of a #entity-tag list (RFC 9110 §5.6.1).

    Unquoted members are taken as S3 takes them (see _BARE_TAG); other
    malformed members are dropped: they could never match anything anyway.
    """
    tags = (_parse_listed_tag(member) for member in _split_list(value))
    return [tag for tag in tags if tag is not None]


def _parse_listed_tag(text: str) -> _EntityTag | None:
    tag = _parse_tag(text)
    if tag is None and _BARE_TAG.fullmatch(text):
        return _EntityTag(weak=False, opaque=text)
    return tag


def _split_list(value: str) -> list[str]:
    # opaque-tags may contain commas, so only split outside of quotes.
    members: list[str] = []
    current: list[str] = []
    quoted = False
    for char in value:
        if char == '"':
            quoted = not quoted
        if char == "," and not quoted:
            members.append("".join(current))
            current = []
        else:
            current.append(char)
    members.append("".join(current))
    return [m.strip(_OWS) for m in members if m.strip(_OWS)]


def _parse_tag(text: str) -> _EntityTag | None:
    match = _ENTITY_TAG.fullmatch(text)
    if match is None:
        return None
    return _EntityTag(weak=match["weak"] is not None, opaque=match["opaque"])


def _origin_tag(etag: str) -> _EntityTag:
    # Tolerate an origin that sends its ETag unquoted rather than making every
    # conditional request against it fail.
    parsed = _parse_tag(etag.strip(_OWS))
    return parsed if parsed is not None else _EntityTag(False, etag.strip(_OWS))


def _modified_since(value: str | None, now: datetime) -> datetime | None:
    """An If-Modified-Since date to evaluate; None when it is to be ignored.

    RFC 9110 §13.1.3 reads the date on the origin server's clock; a date later
    than that clock's current time cannot be the Last-Modified the server
    sent, and RFC 2616 §14.25 made it invalid, so ignored. S3 does the same: a
    GET with a future If-Modified-Since answers 200 with the object, where
    taking the date at its word would answer every such request 304.
    """
    since = _parse_http_date(value)
    if since is None or since > _to_second(now):
        return None
    return since


def _parse_http_date(value: str | None) -> datetime | None:
    """An HTTP-date as aware UTC; None when absent or invalid, i.e. ignored."""
    # A valid HTTP-date has at most one comma; more means a list, which
    # §13.1.3/§13.1.4 say to ignore (parsedate_to_datetime would take the first).
    if value is None or value.count(",") > 1:
        return None
    try:
        parsed = parsedate_to_datetime(value.strip(_OWS))
        # asctime-date carries no zone and is GMT by definition (§5.6.7).
        if parsed.tzinfo is None:
            return parsed.replace(tzinfo=UTC)
        return parsed.astimezone(UTC)
    except (ValueError, TypeError, OverflowError):
        return None


def _to_second(dt: datetime) -> datetime:
    # HTTP-dates have one-second resolution; comparing sub-second timestamps
    # would make a client's echo of our own Last-Modified look "older".
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError("datetime must be timezone-aware")
    return dt.astimezone(UTC).replace(microsecond=0)
