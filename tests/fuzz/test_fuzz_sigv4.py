"""Fuzzing SigV4 canonicalisation and verification (sidecar.s3.sigv4).

No input crashes the verifier: whatever the path, query and headers, it
returns who signed or raises SignatureRejected. None gets past it wrongly: a
request changed after signing verifies only if it still means what was signed
(the same decoded path and query, the same signed header values), and what
botocore signs (as the SDKs and the tiered-storage plugin do) verifies.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import given
from hypothesis import strategies as st

from sidecar.s3.sigv4 import Credential, SignatureRejected, signing_key, verify
from tests.support.fuzz_corpus import CORPUS

AKID, SECRET = "FUZZAKID", "fuzz-secret"
SEEDS: list[dict[str, Any]] = json.loads((CORPUS / "sigv4.json").read_text(encoding="utf-8"))
Headers = list[tuple[str, str]]


def key_for(credential: Credential) -> bytes | None:
    if credential.access_key != AKID:
        return None
    return signing_key(SECRET, credential.date, credential.region, credential.service)


def signed_at(headers: Headers) -> float:
    """The request's own X-Amz-Date as epoch seconds (the verifier's `now`)."""
    from calendar import timegm
    from time import strptime
    stamp = next(v for n, v in headers if n.lower() == "x-amz-date")
    return float(timegm(strptime(stamp, "%Y%m%dT%H%M%SZ")))


def outcome(method: str, raw_path: str, headers: Headers, now: float) -> str | None:
    """The access key that signed, or None when refused; nothing else may escape."""
    try:
        return verify(method, raw_path, headers, key_for, now).access_key
    except SignatureRejected:
        return None


def seed_request(seed: dict[str, Any]) -> tuple[str, str, Headers]:
    return seed["method"], seed["raw_path"], [(n, v) for n, v in seed["headers"]]


def signed_names(headers: Headers) -> set[str]:
    authorization = next(v for n, v in headers if n.lower() == "authorization")
    return set(authorization.partition("SignedHeaders=")[2].partition(",")[0].split(";"))


def meaning(method: str, raw_path: str, headers: Headers, names: set[str]
            ) -> tuple[str, str, list[tuple[str, str]], dict[str, list[str]]]:
    """What a signature vouches for: method, decoded path, decoded query pairs,
    and the signed headers' values (whitespace folded, as SigV4 folds it)."""
    path, _, query = raw_path.partition("?")
    pairs = sorted((unquote(k), unquote(v)) for k, _, v in
                   (item.partition("=") for item in query.split("&") if item))
    values: dict[str, list[str]] = {}
    for name, value in headers:
        if name.lower() in names:
            values.setdefault(name.lower(), []).append(" ".join(value.split()))
    return method, unquote(path), pairs, values


@pytest.mark.parametrize("seed", SEEDS, ids=[s["method"] + " " + s["raw_path"][:30]
                                             for s in SEEDS])
def test_sigv4_corpus(seed: dict[str, Any]) -> None:
    method, raw_path, headers = seed_request(seed)
    now = signed_at(headers)
    assert outcome(method, raw_path, headers, now) == AKID
    # Each signed part changed on its own is refused.
    assert outcome("PATCH" if method != "PATCH" else "GET", raw_path, headers, now) is None
    # Methods are case-sensitive (RFC 9110 section 9.1): "get" is not what was signed.
    assert outcome(method.lower(), raw_path, headers, now) is None
    assert outcome(method, raw_path + ("&" if "?" in raw_path else "?") + "x=1",
                   headers, now) is None
    assert outcome(method, raw_path.replace("/", "/a", 2)[:-1] + "z", headers, now) is None
    for i, (name, value) in enumerate(headers):
        if name.lower() in signed_names(headers) and name.lower() != "authorization":
            changed = [*headers[:i], (name, value + "x"), *headers[i + 1:]]
            assert outcome(method, raw_path, changed, now) is None, name
    # Fifteen minutes and a second later, the signature is stale.
    assert outcome(method, raw_path, headers, now + 15 * 60 + 1) is None


TEXT_PIECES = st.sampled_from(["%", "%2F", "%2f", "%41", "+", " ", "&", "=", "?", "/", "..",
                               "\r\n", "\x00", "\u00e9", "%C3%A9", "%ZZ", ";", ",",
                               "Signature=", "Credential=", "AWS4-HMAC-SHA256", "X-Amz-"])


def edit(text: str, at: int, drop: int, piece: str) -> str:
    at %= len(text) + 1
    return text[:at] + piece + text[at + drop:]


@st.composite
def mutated_request(draw: st.DrawFn) -> tuple[dict[str, Any], str, str, Headers]:
    seed = draw(st.sampled_from(SEEDS))
    method, raw_path, headers = seed_request(seed)
    piece = TEXT_PIECES | st.text(max_size=3)
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.sampled_from(["path", "header", "name", "drop", "add", "method"]))
        if target == "path":
            raw_path = edit(raw_path, draw(st.integers(0, 300)), draw(st.integers(0, 2)),
                            draw(piece))
        elif target == "method":
            method = draw(st.sampled_from(["GET", "HEAD", "PUT", "POST", "DELETE", "get"]))
        elif target == "add":
            headers.insert(draw(st.integers(0, len(headers))),
                           (draw(st.sampled_from(["x-amz-date", "Host", "Authorization",
                                                  "x-amz-meta-a", "Range"])), draw(st.text())))
        elif headers:
            i = draw(st.integers(0, len(headers) - 1))
            name, value = headers[i]
            if target == "drop":
                del headers[i]
            elif target == "name":
                headers[i] = (edit(name, draw(st.integers(0, 50)), 1, draw(piece)), value)
            else:
                headers[i] = (name, edit(value, draw(st.integers(0, 400)),
                                         draw(st.integers(0, 2)), draw(piece)))
    return seed, method, raw_path, headers


@given(mutated_request())
def test_a_changed_request_verifies_only_if_it_means_the_same(
    case: tuple[dict[str, Any], str, str, Headers],
) -> None:
    seed, method, raw_path, headers = case
    original = seed_request(seed)
    now = signed_at(original[2])
    if outcome(method, raw_path, headers, now) is None:
        return
    names = signed_names(original[2])
    assert meaning(method, raw_path, headers, names) == meaning(*original, names)


@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=200),
       st.lists(st.tuples(st.text(max_size=20), st.text(max_size=20)), max_size=4),
       st.text(max_size=100), st.sampled_from(["GET", "PUT", "HEAD", "POST"]))
def test_any_target_and_headers_are_verified_or_refused(
    raw_path: str, headers: Headers, authorization: str, method: str,
) -> None:
    outcome(method, "/" + raw_path, [*headers, ("Authorization", authorization)], 1.8e9)
    outcome(method, "/" + raw_path, headers, 1.8e9)


KEY_CHARS = st.characters(blacklist_categories=("Cs", "Cc"))


@given(st.text(KEY_CHARS, min_size=1, max_size=60),
       st.lists(st.tuples(st.text(KEY_CHARS, min_size=1, max_size=12),
                          st.text(KEY_CHARS, max_size=12)), max_size=3),
       st.dictionaries(st.sampled_from(["x-amz-meta-a", "Range", "If-Match", "Content-MD5"]),
                       st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7e),
                               max_size=30), max_size=3),
       st.sampled_from(["GET", "HEAD", "PUT", "DELETE"]))
def test_what_botocore_signs_verifies(
    key: str, query: list[tuple[str, str]], extra: dict[str, str], method: str,
) -> None:
    encoded = "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in query)
    url = "http://127.0.0.1:9330/tiered/" + quote(key, safe="/~") + \
        (f"?{encoded}" if encoded else "")
    request = AWSRequest(method=method, url=url, headers=extra)
    S3SigV4Auth(Credentials(AKID, SECRET), "s3", "us-east-1").add_auth(request)
    parts = urlsplit(url)
    headers = [("Host", parts.netloc), *request.headers.items()]
    raw_path = parts.path + (f"?{parts.query}" if parts.query else "")
    assert outcome(method, raw_path, headers, signed_at(headers)) == AKID
