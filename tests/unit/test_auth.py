"""The [auth] options and the Authenticator's policy (keys, anonymous, clock)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sidecar.config import load_config
from sidecar.errors import ConfigError
from sidecar.s3.addressing import split_path
from sidecar.s3.auth import Authenticator
from sidecar.s3.operations import classify
from sidecar.s3.sigv4 import Reason, SignatureRejected
from tests.support.clock import FakeClock

SECRET = "very-secret-value-1"


def auth_of(env: dict[str, str], file_values: dict[str, object] | None = None) -> object:
    return load_config({"cache_dir": "/x"}, env, file_values or {}).auth


def test_no_keys_still_means_signed_requests_only() -> None:
    auth = load_config({"cache_dir": "/x"}, {}, {}).auth
    assert auth.keys == {} and not auth.allow_anonymous


def test_keys_from_env_toml_table_and_file(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text("# comment\n\nAKIDFILE:file-secret\n")
    config = load_config(
        {"cache_dir": "/x"}, {"SIDECAR_AUTH_KEYS_FILE": str(keys_file)},
        {"auth": {"keys": {"AKIDTOML": SECRET}}},
    )
    assert dict(config.auth.keys) == {"AKIDTOML": SECRET, "AKIDFILE": "file-secret"}
    assert not config.auth.allow_anonymous  # keys configured: signatures required
    env = load_config({"cache_dir": "/x"}, {"SIDECAR_AUTH_KEYS": "A1:s1, A2:s:2"}, {})
    assert dict(env.auth.keys) == {"A1": "s1", "A2": "s:2"}  # a secret may hold ':'


def test_allow_anonymous_with_keys() -> None:
    config = load_config({"cache_dir": "/x"}, {"SIDECAR_AUTH_KEYS": f"A1:{SECRET}"},
                         {"auth": {"allow_anonymous": True}})
    assert config.auth.allow_anonymous and dict(config.auth.keys) == {"A1": SECRET}


@pytest.mark.parametrize("env,file_values,message", [
    ({"SIDECAR_AUTH_KEYS": f"A1{SECRET}"}, {}, "entry 1: not AKID:SECRET"),
    ({"SIDECAR_AUTH_KEYS": f"A 1:{SECRET}"}, {}, "entry 1: not AKID:SECRET"),
    ({"SIDECAR_AUTH_KEYS": f"A1:{SECRET},A1:{SECRET}"}, {},
     "entry 2: an access key id is given twice"),
    ({"SIDECAR_AUTH_KEYS": f"{SECRET}:,A1:x"}, {}, "entry 1: the secret must be a non-empty"),
    ({}, {"auth": {"keys": {"A1": 5}}}, "must be a non-empty string"),
    ({}, {"auth": {"keyz": "x"}}, "unknown config key 'auth_keyz'"),
    ({"SIDECAR_AUTH_ALLOW_ANONYMOUS": "maybe"}, {}, "not a boolean"),
])
def test_bad_auth_config_is_a_clear_error_without_the_secret(
    env: dict[str, str], file_values: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        load_config({"cache_dir": "/x"}, env, file_values)
    assert SECRET not in str(caught.value)


def test_keys_file_and_table_must_agree(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys"
    keys_file.write_text(f"A1:{SECRET}-other\n")
    with pytest.raises(ConfigError, match="different secrets") as caught:
        load_config({"cache_dir": "/x"}, {"SIDECAR_AUTH_KEYS": f"A1:{SECRET}",
                                          "SIDECAR_AUTH_KEYS_FILE": str(keys_file)}, {})
    assert SECRET not in str(caught.value)
    keys_file.write_text(f"A1:{SECRET}\nbroken line\n")
    with pytest.raises(ConfigError, match="key line 2") as caught:
        load_config({"cache_dir": "/x"}, {"SIDECAR_AUTH_KEYS_FILE": str(keys_file)}, {})
    assert SECRET not in str(caught.value)


def test_secrets_stay_out_of_reprs() -> None:
    config = load_config({"cache_dir": "/x", "admin_token": "tok-" + SECRET},
                         {"SIDECAR_AUTH_KEYS": f"A1:{SECRET}"}, {})
    assert SECRET not in repr(config)
    assert SECRET not in repr(Authenticator(config.auth.keys, False))


def _signed_headers(secret: str) -> list[tuple[str, str]]:
    request = AWSRequest(method="GET", url="http://127.0.0.1:9330/b/k")
    S3SigV4Auth(Credentials("A1", secret), "s3", "us-east-1").add_auth(request)
    return [*request.headers.items(), ("Host", "127.0.0.1:9330")]


def test_authenticator_policy() -> None:
    clock = FakeClock(time.time())  # signatures are dated by the wall clock
    strict = Authenticator({"A1": SECRET}, allow_anonymous=False, clock=clock)
    lenient = Authenticator({"A1": SECRET}, allow_anonymous=True, clock=clock)
    good, bad = _signed_headers(SECRET), _signed_headers("wrong")
    verified = strict.check("GET", "/b/k", good)
    assert verified is not None and verified.access_key == "A1"
    assert lenient.check("GET", "/b/k", [("Host", "h")]) is None
    for authenticator in (strict, lenient):
        with pytest.raises(SignatureRejected) as caught:
            authenticator.check("GET", "/b/k", bad)
        assert caught.value.reason is Reason.BAD_SIGNATURE
    with pytest.raises(SignatureRejected) as caught:
        strict.check("GET", "/b/k", [("Host", "h")])
    assert caught.value.reason is Reason.UNSIGNED
    clock.advance(16 * 60)  # the handed-in clock moves past the skew window
    with pytest.raises(SignatureRejected) as caught:
        strict.check("GET", "/b/k", good)
    assert caught.value.reason is Reason.SKEWED


READS = [
    ("GET", "/b/k"), ("HEAD", "/b/k"), ("GET", "/b/k?x-id=GetObject"), ("GET", "/b/k?versionId=1"),
    ("GET", "/b/k?tagging"), ("GET", "/b/k?acl"), ("GET", "/b/k?uploadId=u"),
    ("GET", "/b?list-type=2&prefix=p"), ("GET", "/b"), ("HEAD", "/b"),
    ("GET", "/b?location"), ("GET", "/b?versions"), ("GET", "/b?uploads"),
]
WRITES = [
    ("PUT", "/b/k"), ("DELETE", "/b/k"), ("POST", "/b?delete"), ("PUT", "/b/k?tagging"),
    ("DELETE", "/b/k?tagging"), ("POST", "/b/k?uploads"), ("PUT", "/b/k?partNumber=1&uploadId=u"),
    ("POST", "/b/k?uploadId=u"), ("DELETE", "/b/k?uploadId=u"), ("PUT", "/b"), ("DELETE", "/b"),
    ("PUT", "/b?policy"), ("GET", "/b?policy"), ("POST", "/b/k?restore"), ("PATCH", "/b/k"),
    # The buckets the sidecar's identity has are no anonymous business.
    ("GET", "/"),
    # A sub-resource beside a listing is no listing.
    ("GET", "/b?list-type=2&policy"), ("GET", "/b?uploads&acl"), ("GET", "/b/k?tagging&policy"),
]


def _operation(method: str, target: str, headers: dict[str, str] | None = None) -> str:
    """The S3 operation the data port makes of the request (split_path, classify)."""
    bucket, key, query = split_path(target)
    return classify(method, bucket, key, query, headers).name


@pytest.mark.parametrize("method,target", READS + WRITES)
def test_anonymous_requests_only_read(method: str, target: str) -> None:
    # Everything not served from the cache goes to the origin with the sidecar's
    # credentials: an anonymous PUT or DELETE would write with them.
    lenient = Authenticator({"A1": SECRET}, allow_anonymous=True)
    assert lenient.check(method, target, [("Host", "h")]) is None  # goes on, anonymous
    assert lenient.anonymous_may(_operation(method, target)) is ((method, target) in READS)
    # No keys configured: the same, anonymous requests only ever read.
    assert Authenticator({}, allow_anonymous=True).anonymous_may(_operation(method, target)) \
        is ((method, target) in READS)


def test_the_origin_credentials_sign_and_follow_their_rotation() -> None:
    """With no keys configured, requests signed with the sidecar's own origin
    credentials pass (the plugin shares them); anything else is refused, and a
    rotated secret is asked for each time."""
    own: list[tuple[str, str] | None] = [("A1", SECRET)]
    auth = Authenticator({}, allow_anonymous=False, origin_key=lambda: own[0])
    verified = auth.check("GET", "/b/k", _signed_headers(SECRET))
    assert verified is not None and verified.access_key == "A1"
    for refused in (_signed_headers("wrong"), [("Host", "h")]):
        with pytest.raises(SignatureRejected):
            auth.check("GET", "/b/k", refused)
    own[0] = ("A1", "rotated-" + SECRET)
    with pytest.raises(SignatureRejected) as caught:
        auth.check("GET", "/b/k", _signed_headers(SECRET))
    assert caught.value.reason is Reason.BAD_SIGNATURE
    assert auth.check("GET", "/b/k", _signed_headers("rotated-" + SECRET)) is not None
    own[0] = None  # no origin credentials: nothing signs
    with pytest.raises(SignatureRejected):
        auth.check("GET", "/b/k", _signed_headers("rotated-" + SECRET))


def test_an_anonymous_copy_is_a_write() -> None:
    lenient = Authenticator({"A1": SECRET}, allow_anonymous=True)
    assert not lenient.anonymous_may(
        _operation("PUT", "/b/k", {"X-Amz-Copy-Source": "/b/secret"}))


def test_the_verified_requests_chunk_signer_holds_no_secret_in_its_repr() -> None:
    verified = Authenticator({"A1": SECRET}, allow_anonymous=False).check(
        "GET", "/b/k", _signed_headers(SECRET))
    assert verified is not None
    assert SECRET not in repr(verified) and verified.chunk_signer.key.hex() not in repr(verified)
