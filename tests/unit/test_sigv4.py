"""SigV4 verification against signatures botocore makes, and against tampering."""

from __future__ import annotations

import hashlib
import time
from email.utils import formatdate
from typing import Any
from urllib.parse import quote, urlsplit

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.s3.sigv4 import (
    MAX_SKEW_S,
    ChunkSigner,
    Credential,
    PresignedMemo,
    Reason,
    SignatureRejected,
    is_signed,
    signing_key,
    verify,
)
from sidecar.telemetry.metrics import AUTH_FAILURE_REASONS

KEYS = {"AKIDEXAMPLE": "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "AKID2": "other-secret"}
HOST = "127.0.0.1:9330"


def key_for(credential: Credential) -> bytes | None:
    secret = KEYS.get(credential.access_key)
    if secret is None:
        return None
    return signing_key(secret, credential.date, credential.region, credential.service)


def wire(request: AWSRequest) -> tuple[str, str, list[tuple[str, str]]]:
    """What the sidecar receives for a botocore-signed request: method, target, headers."""
    parts = urlsplit(request.url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    headers = [(name, value) for name, value in request.headers.items()]
    if not any(name.lower() == "host" for name, _ in headers):
        headers.append(("Host", parts.netloc))
    return request.method, target, headers


def signed(
    method: str = "GET",
    target: str = "/bucket/topic-0/00000000000000000000-seg.log",
    headers: list[tuple[str, str]] | None = None,
    access_key: str = "AKIDEXAMPLE",
    secret: str | None = None,
    region: str = "us-east-1",
    presign_expires: int | None = None,
) -> tuple[str, str, list[tuple[str, str]]]:
    request = AWSRequest(method=method, url=f"http://{HOST}{target}")
    for name, value in headers or []:
        request.headers[name] = value  # HTTPHeaders: a repeated name adds a value
    credentials = Credentials(access_key, secret if secret is not None else KEYS[access_key])
    if presign_expires is None:
        S3SigV4Auth(credentials, "s3", region).add_auth(request)
    else:
        S3SigV4QueryAuth(credentials, "s3", region, expires=presign_expires).add_auth(request)
    return wire(request)


def rejected(method: str, target: str, headers: list[tuple[str, str]],
             now: float | None = None) -> Reason:
    with pytest.raises(SignatureRejected) as caught:
        verify(method, target, headers, key_for, time.time() if now is None else now)
    return caught.value.reason


def test_header_signature_of_a_ranged_get_verifies() -> None:
    method, target, headers = signed(headers=[("Range", "bytes=0-1048575")])
    assert any(name == "Authorization" for name, _ in headers)
    assert verify(method, target, headers, key_for, time.time()).access_key == "AKIDEXAMPLE"


def test_presigned_url_verifies_and_expires() -> None:
    method, target, headers = signed(presign_expires=60)
    assert "X-Amz-Signature=" in target
    now = time.time()
    assert verify(method, target, headers, key_for, now).access_key == "AKIDEXAMPLE"
    # Long after its making but inside its expiry a presigned URL still works.
    method, target, headers = signed(presign_expires=3600)
    assert verify(method, target, headers, key_for, now + 3000).access_key == "AKIDEXAMPLE"
    assert rejected(method, target, headers, now + 3700) is Reason.EXPIRED


def test_presigned_url_from_the_future_is_refused() -> None:
    method, target, headers = signed(presign_expires=60)
    assert rejected(method, target, headers, time.time() - MAX_SKEW_S - 60) is Reason.SKEWED


@pytest.mark.parametrize("offset", [MAX_SKEW_S + 30, -(MAX_SKEW_S + 30)])
def test_header_signature_outside_the_skew_window_is_refused(offset: float) -> None:
    method, target, headers = signed()
    assert rejected(method, target, headers, time.time() + offset) is Reason.SKEWED
    # Inside the window it passes.
    assert verify(method, target, headers, key_for, time.time() + offset * 0.9)


def test_wrong_secret_unknown_key_and_unsigned() -> None:
    assert rejected(*signed(secret="not-the-secret")) is Reason.BAD_SIGNATURE
    with pytest.raises(KeyError):
        signed(access_key="AKIDUNKNOWN")
    request = AWSRequest(method="GET", url=f"http://{HOST}/bucket/key")
    S3SigV4Auth(Credentials("AKIDUNKNOWN", "x"), "s3", "us-east-1").add_auth(request)
    assert rejected(*wire(request)) is Reason.UNKNOWN_KEY
    assert rejected("GET", "/bucket/key", [("Host", HOST)]) is Reason.UNSIGNED


def test_another_keys_secret_does_not_sign_for_this_key() -> None:
    assert rejected(*signed(access_key="AKIDEXAMPLE", secret=KEYS["AKID2"])) is Reason.BAD_SIGNATURE


def test_the_region_in_the_credential_is_the_clients_own() -> None:
    # The plugin signs for its origin's region; any region the key signed for holds.
    method, target, headers = signed(region="eu-west-1")
    assert verify(method, target, headers, key_for, time.time()).access_key == "AKIDEXAMPLE"


def test_date_header_instead_of_x_amz_date() -> None:
    # botocore (and the spec) use Date when the request already has one.
    method, target, headers = signed(headers=[("Date", formatdate(usegmt=True))])
    assert not any(name.lower() == "x-amz-date" for name, _ in headers)
    assert verify(method, target, headers, key_for, time.time()).access_key == "AKIDEXAMPLE"


def replace_header(headers: list[tuple[str, str]], name: str, value: str) -> list[tuple[str, str]]:
    return [(n, value if n.lower() == name.lower() else v) for n, v in headers]


def tamperings() -> list[tuple[str, Any]]:
    return [
        ("method", lambda m, t, h: ("HEAD", t, h)),
        ("other key", lambda m, t, h: (m, t.replace("seg.log", "seg.lof"), h)),
        ("extra query", lambda m, t, h: (m, t + ("&" if "?" in t else "?") + "partNumber=1", h)),
        ("range", lambda m, t, h: (m, t, replace_header(h, "Range", "bytes=0-"))),
        ("host", lambda m, t, h: (m, t, replace_header(h, "Host", "evil:1"))),
        ("payload hash", lambda m, t, h: (m, t, replace_header(h, "X-Amz-Content-SHA256",
                                                               "UNSIGNED-PAYLOAD"))),
        ("dot segment", lambda m, t, h: (m, t.replace("/topic-0/", "/topic-0/./"), h)),
        ("double slash", lambda m, t, h: (m, t.replace("/topic-0/", "/topic-0//"), h)),
    ]


@pytest.mark.parametrize("name,tamper", tamperings(), ids=[n for n, _ in tamperings()])
def test_tampered_header_signed_request_is_refused(name: str, tamper: Any) -> None:
    original = signed(headers=[("Range", "bytes=0-99")])
    assert rejected(*tamper(*original)) in (Reason.BAD_SIGNATURE, Reason.MALFORMED)


def test_tampered_presigned_url_is_refused() -> None:
    method, target, headers = signed(presign_expires=600)
    assert rejected(method, target.replace("X-Amz-Expires=600", "X-Amz-Expires=6000"),
                    headers) is Reason.BAD_SIGNATURE
    assert rejected(method, target.replace("seg.log", "seg.lof"), headers) is Reason.BAD_SIGNATURE
    flipped = target[:-1] + ("0" if target[-1] != "0" else "1")
    assert rejected(method, flipped, headers) is Reason.BAD_SIGNATURE


@pytest.mark.parametrize("authorization", [
    "AWS AKIDEXAMPLE:c2lnbmF0dXJl",  # SigV2
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request",
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE, SignedHeaders=host, Signature=00",
    "AWS4-HMAC-SHA256 Credential=A/2026/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=0",
    "AWS4-HMAC-SHA256 Credential=A/20260101/us-east-1/sqs/aws4_request, SignedHeaders=host, "
    "Signature=" + "0" * 64,
    "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/20260101/us-east-1/s3/aws4_request, "
    "SignedHeaders=range, Signature=" + "0" * 64,
    "garbage \x00\xff",
    "",
])
def test_malformed_authorization_is_refused_as_malformed(authorization: str) -> None:
    headers = [("Host", HOST), ("Authorization", authorization),
               ("x-amz-date", time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())),
               ("x-amz-content-sha256", "UNSIGNED-PAYLOAD")]
    assert rejected("GET", "/bucket/key", headers) is Reason.MALFORMED


def test_both_auth_forms_at_once_are_refused() -> None:
    method, target, headers = signed(presign_expires=60)
    _, _, header_signed = signed()
    assert rejected(method, target, headers + [h for h in header_signed
                                                if h[0] == "Authorization"]) is Reason.MALFORMED


def test_is_signed() -> None:
    _, target, _ = signed(presign_expires=60)
    assert is_signed(target, [("Host", HOST)])
    assert is_signed("/b/k", [("authorization", "x")])
    assert not is_signed("/b/k?x-id=GetObject", [("Host", HOST)])


def test_failure_reasons_are_the_metric_labels() -> None:
    assert {reason.value for reason in Reason} == set(AUTH_FAILURE_REASONS)


# --- properties: whatever botocore signs, we verify; whatever is changed, we refuse.

# Any key S3 takes (no control characters, no dot segments: the data port refuses those).
_key_text = st.text(
    st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40
).filter(lambda k: all(s not in (".", "..") for s in k.split("/")))
_token = st.text(st.characters(blacklist_categories=("Cs", "Cc")), max_size=12)
_header_name = st.from_regex(r"\Ax-(amz-meta|custom)-[a-z0-9]{1,8}\Z")
# Printable ASCII with runs of spaces, which canonicalisation collapses.
_header_value = st.from_regex(r"\A[!-~]([ !-~]{0,30}[!-~])?\Z")


@st.composite
def _requests(draw: st.DrawFn) -> tuple[str, str, list[tuple[str, str]]]:
    key = draw(_key_text)
    path = "/" + draw(st.from_regex(r"\A[a-z0-9][a-z0-9-]{2,20}\Z")) + "/" + key
    # botocore's own path encoding (RFC 3986 unreserved and "/"), or a client
    # that leaves some sub-delims unencoded: both are signed as sent.
    safe = draw(st.sampled_from(["/~", "/~!*'()", "/~:@$,;="]))
    target = quote(path, safe=safe)
    # Names of the auth parameters themselves are left out: a repeated one is
    # refused as malformed, not as a bad signature.
    params = draw(st.lists(st.tuples(_token.filter(lambda n: not n.lower().startswith("x-amz-")),
                                     _token), max_size=4))
    if params:
        target += "?" + "&".join(
            f"{quote(name, safe='-_.~')}={quote(value, safe='-_.~')}" for name, value in params
        )
    headers = draw(st.lists(st.tuples(_header_name, _header_value), max_size=4))
    if draw(st.booleans()):
        headers.append(("Range", draw(st.from_regex(r"\Abytes=[0-9]{1,6}-[0-9]{0,6}\Z"))))
    method = draw(st.sampled_from(["GET", "HEAD", "PUT", "DELETE"]))
    return method, target, headers


_PROPERTY = settings(max_examples=150, deadline=None, derandomize=True,
                     suppress_health_check=[HealthCheck.too_slow])


@_PROPERTY
@given(_requests(), st.booleans(), st.sampled_from(["us-east-1", "eu-west-1"]))
def test_botocore_signatures_verify(
    request_parts: tuple[str, str, list[tuple[str, str]]], presign: bool, region: str
) -> None:
    method, target, headers = request_parts
    wired = signed(method, target, headers, region=region, presign_expires=300 if presign else None)
    assert verify(*wired, key_for, time.time()).access_key == "AKIDEXAMPLE"


@_PROPERTY
@given(_requests(), st.booleans(), st.data())
def test_any_change_to_a_signed_part_is_refused(
    request_parts: tuple[str, str, list[tuple[str, str]]], presign: bool, data: st.DataObject
) -> None:
    method, target, headers = signed(*request_parts, presign_expires=300 if presign else None)
    path, _, query = target.partition("?")
    signed_names = {n.lower() for n, _ in headers if n.lower().startswith(("x-amz-meta", "x-custom",
                                                                            "range"))}
    choice = data.draw(st.sampled_from(["method", "path", "query", "header"]))
    if choice == "method":
        method = "POST"
    elif choice == "path":
        path += data.draw(st.sampled_from(["x", "%2F", "/"]))
    elif choice == "query":
        query += ("&" if query else "") + "tampered=1"
    else:
        if not signed_names or presign:
            headers = replace_header(headers, "Host", "127.0.0.2:9330")
        else:
            name = data.draw(st.sampled_from(sorted(signed_names)))
            headers = [(n, v + "x" if n.lower() == name else v) for n, v in headers]
    target = path + (f"?{query}" if query else "")
    assert rejected(method, target, headers) is Reason.BAD_SIGNATURE


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(max_size=200), st.text(max_size=200), st.lists(st.tuples(
    st.sampled_from(["Authorization", "x-amz-date", "Date", "x-amz-content-sha256", "Host"]),
    st.text(max_size=120)), max_size=6))
def test_garbage_never_escapes_as_anything_but_a_rejection(
    path: str, query: str, headers: list[tuple[str, str]]
) -> None:
    try:
        verify("GET", "/" + path + "?" + query, headers, key_for, time.time())
    except SignatureRejected as exc:
        assert exc.reason in Reason
    else:
        pytest.fail("garbage verified")


# --- every x-amz-* header is signed (S3's HeadersNotSigned)


@pytest.mark.parametrize("name", ["x-amz-copy-source", "X-Amz-Copy-Source", "x-amz-meta-a",
                                  "x-amz-server-side-encryption", "X-AMZ-ACL"])
@pytest.mark.parametrize("presign", [False, True])
def test_an_unsigned_amz_header_is_refused(name: str, presign: bool) -> None:
    # The pass-through would forward it under the sidecar's own signature.
    method, target, headers = signed("PUT", "/bucket/upload/k",
                                     presign_expires=300 if presign else None)
    assert verify(method, target, headers, key_for, time.time()).access_key == "AKIDEXAMPLE"
    with pytest.raises(SignatureRejected, match="not signed") as caught:
        verify(method, target, headers + [(name, "/bucket/secret/payroll")], key_for, time.time())
    assert caught.value.reason is Reason.MALFORMED


def test_signed_amz_headers_pass_and_unsigned_ones_beside_them_do_not() -> None:
    method, target, headers = signed("PUT", "/bucket/k", headers=[
        ("x-amz-meta-a", "1"), ("x-amz-meta-a", "2"), ("x-amz-acl", "private")])
    assert verify(method, target, headers, key_for, time.time())
    # A value added to a signed name breaks the signature; a new name is unsigned.
    assert rejected(method, target, headers + [("x-amz-acl", "public-read")]) \
        is Reason.BAD_SIGNATURE
    assert rejected(method, target, headers + [("x-amz-tagging", "a=b")]) is Reason.MALFORMED
    # Presigned with the headers signed (boto3's generate_presigned_url with Metadata).
    method, target, headers = signed("PUT", "/bucket/k", headers=[("x-amz-meta-a", "1")],
                                     presign_expires=60)
    assert "x-amz-meta-a" in target.lower()
    assert verify(method, target, headers, key_for, time.time())


def test_a_presigned_url_may_carry_its_payload_hash_unsigned() -> None:
    # The payload hash is the last line of the canonical request: it is covered
    # whether or not SignedHeaders names it.
    method, target, headers = signed(presign_expires=60)
    sent = headers + [("X-Amz-Content-SHA256", "UNSIGNED-PAYLOAD")]
    assert verify(method, target, sent, key_for, time.time()).access_key == "AKIDEXAMPLE"
    assert rejected(method, target, headers + [("x-amz-content-sha256", "ab" * 32)]) \
        is Reason.BAD_SIGNATURE


# --- presigned URLs remembered once verified

def remembered(method: str, target: str, headers: list[tuple[str, str]], memo: PresignedMemo,
               now: float, keys: Any = key_for) -> Reason | None:
    """None if the request verifies through `memo`, else why it was refused."""
    try:
        verify(method, target, headers, keys, now, memo)
    except SignatureRejected as exc:
        return exc.reason
    return None


def test_a_presigned_url_used_again_is_answered_from_the_memo() -> None:
    memo = PresignedMemo()
    method, target, headers = signed(presign_expires=600)
    now = time.time()
    first = verify(method, target, headers + [("Range", "bytes=0-")], key_for, now, memo)
    again = verify(method, target, headers + [("Range", "bytes=8-")], key_for, now + 1, memo)
    assert again is first  # nothing worked out again
    assert len(memo) == 1
    # Another method with the same URL is another request: verified on its own.
    assert remembered("HEAD", target, headers, memo, now) is Reason.BAD_SIGNATURE


def test_what_may_change_between_two_uses_is_checked_again() -> None:
    memo = PresignedMemo()
    method, target, headers = signed(presign_expires=600)
    now = time.time()
    assert remembered(method, target, headers, memo, now) is None
    assert remembered(method, target, headers, memo, now + 700) is Reason.EXPIRED
    assert remembered(method, target, headers + [("x-amz-acl", "public-read")], memo, now) \
        is Reason.MALFORMED
    # The signed Host and the payload hash are compared as sent.
    moved = [(name, "127.0.0.1:1" if name.lower() == "host" else value)
             for name, value in headers]
    assert remembered(method, target, moved, memo, now) is Reason.BAD_SIGNATURE
    assert remembered(method, target, headers + [("x-amz-content-sha256", "ab" * 32)],
                      memo, now) is Reason.BAD_SIGNATURE
    # A rotated secret or a removed key: the URL no longer proves anything.
    def rotated(credential: Credential) -> bytes | None:
        return signing_key("rotated", credential.date, credential.region, credential.service)
    assert remembered(method, target, headers, memo, now, rotated) is Reason.BAD_SIGNATURE
    assert remembered(method, target, headers, memo, now, lambda _: None) is Reason.UNKNOWN_KEY
    # And the URL as it was still verifies.
    assert remembered(method, target, headers, memo, now) is None


def test_refusals_and_header_signatures_are_not_remembered_and_the_memo_is_bounded() -> None:
    memo = PresignedMemo(capacity=3)
    method, target, headers = signed()
    assert remembered(method, target, headers, memo, time.time()) is None
    assert remembered(*signed(presign_expires=60, secret="not-the-secret"), memo, time.time()) \
        is Reason.BAD_SIGNATURE
    assert len(memo) == 0
    for number in range(5):
        method, target, headers = signed(target=f"/bucket/k{number}", presign_expires=60)
        assert remembered(method, target, headers, memo, time.time()) is None
    assert len(memo) == 3


# --- what a verified request hands on for its chunk signatures

AWS_EXAMPLE_KEY = signing_key("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "20130524",
                              "us-east-1", "s3")


def test_chunk_signatures_match_the_aws_example() -> None:
    # sigv4-streaming.html, "Example: PUT Object": 64 KiB and 1 KiB of "a", then
    # the final empty chunk, chained to the request's signature.
    signer = ChunkSigner(AWS_EXAMPLE_KEY, "20130524T000000Z", "20130524/us-east-1/s3/aws4_request",
                         "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9")
    previous = signer.seed
    for data, expected in [
        (b"a" * 65536, "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"),
        (b"a" * 1024, "0055627c9e194cb4542bae2aa5492e3c1575bbb81b612b7d234b86a503ef5497"),
        (b"", "b6c6ea8a5354eaf15b3cb7646744f4275b71ea724fed81ceb9323e279d449df9"),
    ]:
        previous = signer.chunk_signature(previous, hashlib.sha256(data).hexdigest())
        assert previous == expected


def test_the_chunk_signer_is_the_verified_requests_and_keeps_its_key_out_of_repr() -> None:
    method, target, headers = signed("PUT", "/bucket/k", headers=[
        ("x-amz-content-sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")])
    verified = verify(method, target, headers, key_for, time.time())
    authorization = dict(headers)["Authorization"]
    timestamp = dict(headers)["X-Amz-Date"]
    signer = verified.chunk_signer
    assert signer.seed == authorization.rpartition("Signature=")[2]
    assert signer.timestamp == timestamp
    assert signer.scope == f"{timestamp[:8]}/us-east-1/s3/aws4_request"
    assert signer.key == signing_key(KEYS["AKIDEXAMPLE"], timestamp[:8], "us-east-1", "s3")
    for text in (repr(verified), str(verified), repr(signer)):
        assert signer.key.hex() not in text and repr(signer.key) not in text
        assert KEYS["AKIDEXAMPLE"] not in text


# Text of a path or query component as clients send it: unreserved characters,
# '/', characters quote() encodes, and escapes of either case and any byte
# (some malformed).
_COMPONENT = st.lists(st.one_of(
    st.sampled_from("aZ09-._~/+=!*'() é"),
    st.integers(0, 255).map(lambda byte: f"%{byte:02X}"),
    st.integers(0, 255).map(lambda byte: f"%{byte:02x}"),
    st.sampled_from(["%", "%4", "%G1", "%2f", "%2F"]),
), max_size=12).map("".join)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(text=_COMPONENT)
def test_text_taken_as_already_encoded_is_what_encoding_it_again_gives(text: str) -> None:
    """The short cut (no decode and encode for text already in SigV4's form)
    changes no canonical request: where it applies, the long way gives the
    same text, for a path (with '/') and for a query component."""
    from urllib.parse import unquote_to_bytes

    from sidecar.s3.sigv4 import _CANONICAL_PATH_RE, _CANONICAL_QUERY_RE

    for pattern, safe in ((_CANONICAL_QUERY_RE, ""), (_CANONICAL_PATH_RE, "/")):
        long_way = quote(unquote_to_bytes(text), safe=safe)
        if pattern.match(text):
            assert long_way == text
        # The pattern takes every text the long way leaves as it is (so the
        # usual request never goes the long way).
        if long_way == text:
            assert pattern.match(text)


def test_a_presigned_url_with_escapes_to_normalise_still_verifies() -> None:
    """A client that escapes characters it need not (a lower-case escape, an
    unreserved letter escaped) signs the canonical form: still verified, and
    so is a repeated parameter name in another case."""
    method, target, headers = signed(target="/bucket/topic-0/seg.log?x-id=GetObject",
                                     presign_expires=300)
    path, _, query = target.partition("?")
    tweaked = query.replace("%2F", "%2f").replace("x-id=GetObject", "x-id=Get%4Fbject")
    now = time.time()
    assert verify(method, f"{path}?{tweaked}", headers, key_for, now).access_key == "AKIDEXAMPLE"
    with pytest.raises(SignatureRejected) as refused:
        verify(method, f"{path}?{query}&X-AMZ-SIGNATURE=" + "0" * 64, headers, key_for, now)
    assert refused.value.reason is Reason.MALFORMED
