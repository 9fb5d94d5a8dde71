"""Data-port SigV4 and admin-token checks against the sidecar as a process.

boto3 signs as the brokers' plugin would; refusals are S3's 403 error XML, with
the code S3 gives each (SignatureDoesNotMatch, InvalidAccessKeyId,
RequestTimeTooSkewed, AccessDenied for the rest).
No secret shows in stderr, the access log, /api/v1/stats or /metrics.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import botocore.auth
import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from sidecar.tools.local_s3 import CREDENTIALS, LocalS3, loopback_client
from tests.support.processes import SidecarProcess
from tests.support.signed_chunks import crc32_trailer, signed_chunked
from tests.support.waiting import eventually

AKID, SECRET = "AKIDBROKER1", "broker-secret-Xq7pLm2"
AKID2, SECRET2 = "AKIDBROKER2", "second-secret-Zt9wRv4"
ADMIN_TOKEN = "admin-token-Hn3kPq8"
SECRETS = (SECRET, SECRET2, ADMIN_TOKEN)
BODY = os.urandom(300_000)
KEY = "orders-x/0/00000000000000000000-seg.log"


def client(endpoint: str, akid: str, secret: str, signature_version: str = "s3v4") -> Any:
    return loopback_client(endpoint, key=akid, secret=secret, region="eu-west-1",
                           signature_version=signature_version)


@pytest.fixture(scope="module")
def auth_bucket(local_s3: LocalS3) -> Iterator[str]:
    origin = loopback_client(local_s3.endpoint, key=CREDENTIALS["AWS_ACCESS_KEY_ID"],
                             secret=CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
    origin.create_bucket(Bucket="auth-test")
    origin.put_object(Bucket="auth-test", Key=KEY, Body=BODY)
    origin.close()
    yield "auth-test"


@pytest.fixture(scope="module")
def secured_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("auth")


@pytest.fixture(scope="module")
def secured(local_s3: LocalS3, auth_bucket: str, secured_dir: Path) -> Iterator[SidecarProcess]:
    """Two keys (one from env, one from a keys file), an admin token, an access log."""
    base = secured_dir
    (base / "cache").mkdir()
    keys_file = base / "keys"
    keys_file.write_text(f"# mounted from a Kubernetes Secret\n{AKID2}:{SECRET2}\n")
    with SidecarProcess(
        local_s3.endpoint, base / "cache", "--block-size", "64KiB", "--cache-size", "8MiB",
        "--admin-token", ADMIN_TOKEN, "--access-log", str(base / "access.log"),
        env={"SIDECAR_AUTH_KEYS": f"{AKID}:{SECRET}", "SIDECAR_AUTH_KEYS_FILE": str(keys_file),
             "SIDECAR_LOG_LEVEL": "INFO", "SIDECAR_AUTH_ALLOW_ANONYMOUS": "false"},
    ) as process:
        yield process


def fetch(url: str, headers: dict[str, str] | None = None,
          method: str = "GET", data: bytes | None = None) -> tuple[int, bytes]:
    headers = dict(headers or {})
    if data is not None and not any(name.lower() == "content-type" for name in headers):
        # urllib's default is a form, which moto parses away.
        headers["Content-Type"] = "application/octet-stream"
    request = urllib.request.Request(url, data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def assert_access_denied(status: int, body: bytes, says: str, code: str = "AccessDenied") -> None:
    assert status == 403, body
    assert f"<Code>{code}</Code>".encode() in body
    assert says.encode() in body


def test_the_right_keys_read(secured: SidecarProcess, auth_bucket: str) -> None:
    for akid, secret in ((AKID, SECRET), (AKID2, SECRET2)):
        s3 = client(secured.data_url, akid, secret)
        try:
            assert s3.get_object(Bucket=auth_bucket, Key=KEY)["Body"].read() == BODY
            ranged = s3.get_object(Bucket=auth_bucket, Key=KEY, Range="bytes=70000-140001")
            assert ranged["ResponseMetadata"]["HTTPStatusCode"] == 206
            assert ranged["Body"].read() == BODY[70000:140002]
            assert s3.head_object(Bucket=auth_bucket, Key=KEY)["ContentLength"] == len(BODY)
            url = s3.generate_presigned_url(
                "get_object", Params={"Bucket": auth_bucket, "Key": KEY}, ExpiresIn=300)
            assert fetch(url, {"Range": "bytes=5-9"}) == (206, BODY[5:10])
        finally:
            s3.close()


def test_wrong_secret_and_unknown_key_are_refused(
    secured: SidecarProcess, auth_bucket: str
) -> None:
    before = secured.metric("sidecar_auth_failures_total", reason="bad_signature")
    for akid, secret, code in ((AKID, "not-the-secret", "SignatureDoesNotMatch"),
                               (AKID, SECRET2, "SignatureDoesNotMatch"),
                               ("AKIDSTRANGER", SECRET, "InvalidAccessKeyId")):
        s3 = client(secured.data_url, akid, secret)
        try:
            with pytest.raises(ClientError) as caught:
                s3.get_object(Bucket=auth_bucket, Key=KEY)
            assert caught.value.response["Error"]["Code"] == code
            assert caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
            with pytest.raises(ClientError) as head_caught:
                s3.head_object(Bucket=auth_bucket, Key=KEY)
            assert head_caught.value.response["ResponseMetadata"]["HTTPStatusCode"] == 403
        finally:
            s3.close()
    assert secured.metric("sidecar_auth_failures_total", reason="bad_signature") == before + 4
    assert secured.metric("sidecar_auth_failures_total", reason="unknown_key") >= 2


def test_unsigned_request_is_refused(secured: SidecarProcess, auth_bucket: str) -> None:
    status, body = fetch(f"{secured.data_url}/{auth_bucket}/{KEY}")
    assert_access_denied(status, body, "Anonymous requests are not allowed")
    # Every method is checked before anything else happens.
    for method in ("PUT", "DELETE", "POST"):
        status, body = fetch(f"{secured.data_url}/{auth_bucket}/{KEY}", method=method)
        assert_access_denied(status, body, "Anonymous")
    assert fetch(f"{secured.data_url}/", method="GET")[0] == 403
    assert secured.metric("sidecar_auth_failures_total", reason="unsigned") >= 5


def test_expired_presigned_url_is_refused(
    secured: SidecarProcess, auth_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Signed ten seconds ago for one second: expired when it arrives, with no
    # wait (and well inside the 15 minutes of clock skew the sidecar allows).
    then = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(seconds=10)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: then)
    s3 = client(secured.data_url, AKID, SECRET)
    try:
        url = s3.generate_presigned_url(
            "get_object", Params={"Bucket": auth_bucket, "Key": KEY}, ExpiresIn=1)
    finally:
        s3.close()
    monkeypatch.undo()
    assert_access_denied(*fetch(url), "Request has expired")
    tampered = url.replace("X-Amz-Expires=1", "X-Amz-Expires=3600")
    assert_access_denied(*fetch(tampered), "does not match", "SignatureDoesNotMatch")


def test_signature_version_2_is_refused_as_such(secured: SidecarProcess, auth_bucket: str) -> None:
    s3 = client(secured.data_url, AKID, SECRET, signature_version="s3")
    try:
        url = s3.generate_presigned_url(
            "get_object", Params={"Bucket": auth_bucket, "Key": KEY}, ExpiresIn=300)
    finally:
        s3.close()
    assert "AWSAccessKeyId=" in url
    assert_access_denied(*fetch(url), "Signature Version 4")


def test_a_signature_older_than_fifteen_minutes_is_refused(
    secured: SidecarProcess, auth_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    then = datetime.datetime.now(datetime.UTC).replace(tzinfo=None) - datetime.timedelta(minutes=16)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: then)
    request = AWSRequest(method="GET", url=f"{secured.data_url}/{auth_bucket}/{KEY}")
    S3SigV4Auth(Credentials(AKID, SECRET), "s3", "us-east-1").add_auth(request)
    assert_access_denied(*fetch(request.url, dict(request.headers.items())), "too large",
                         "RequestTimeTooSkewed")
    # The same signing, done now, passes.
    monkeypatch.undo()
    request = AWSRequest(method="GET", url=f"{secured.data_url}/{auth_bucket}/{KEY}")
    S3SigV4Auth(Credentials(AKID, SECRET), "s3", "us-east-1").add_auth(request)
    assert fetch(request.url, dict(request.headers.items())) == (200, BODY)


def test_allow_anonymous_serves_unsigned_but_still_checks_signatures(
    local_s3: LocalS3, auth_bucket: str, tmp_path: Path, origin_s3: Any
) -> None:
    with SidecarProcess(
        local_s3.endpoint, tmp_path, "--block-size", "64KiB", "--cache-size", "8MiB",
        env={"SIDECAR_AUTH_KEYS": f"{AKID}:{SECRET}", "SIDECAR_AUTH_ALLOW_ANONYMOUS": "true"},
    ) as sidecar:
        assert fetch(f"{sidecar.data_url}/{auth_bucket}/{KEY}", {"Range": "bytes=0-3"}) == (
            206, BODY[:4])
        status, listing = fetch(f"{sidecar.data_url}/{auth_bucket}?list-type=2")
        assert status == 200 and KEY.encode() in listing
        s3 = client(sidecar.data_url, AKID, "wrong")
        try:
            with pytest.raises(ClientError) as caught:
                s3.get_object(Bucket=auth_bucket, Key=KEY)
            assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        finally:
            s3.close()
        # Anonymous means read-only: writes would go out with the sidecar's credentials.
        status, body = fetch(f"{sidecar.data_url}/{auth_bucket}/anonymous.bin", method="PUT",
                             data=b"written by nobody")
        assert_access_denied(status, body, "only read")
        with pytest.raises(ClientError):
            origin_s3.head_object(Bucket=auth_bucket, Key="anonymous.bin")
        assert_access_denied(*fetch(f"{sidecar.data_url}/{auth_bucket}/{KEY}", method="DELETE"),
                             "only read")
        assert_access_denied(*fetch(
            f"{sidecar.data_url}/{auth_bucket}?delete", method="POST",
            data=f"<Delete><Object><Key>{KEY}</Key></Object></Delete>".encode()), "only read")
        assert origin_s3.head_object(Bucket=auth_bucket, Key=KEY)["ContentLength"] == len(BODY)
        # A SigV2 presigned URL is a signature, and not one accepted here.
        v2 = client(sidecar.data_url, AKID, SECRET, signature_version="s3")
        try:
            url = v2.generate_presigned_url(
                "get_object", Params={"Bucket": auth_bucket, "Key": KEY}, ExpiresIn=300)
        finally:
            v2.close()
        assert_access_denied(*fetch(url), "Signature Version 4")


def test_unsigned_amz_headers_are_refused(
    secured: SidecarProcess, auth_bucket: str, origin_s3: Any
) -> None:
    s3 = client(secured.data_url, AKID, SECRET)
    try:
        url = s3.generate_presigned_url(
            "put_object", Params={"Bucket": auth_bucket, "Key": "upload/k"}, ExpiresIn=300)
    finally:
        s3.close()
    # A presigned PUT turned into a copy of another object by one added header:
    # the pass-through would have sent it signed by the sidecar.
    status, body = fetch(url, {"x-amz-copy-source": f"/{auth_bucket}/{KEY}"}, "PUT", b"")
    assert_access_denied(status, body, "not signed: x-amz-copy-source")
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=auth_bucket, Key="upload/k")
    # The same with a header-signed request.
    request = AWSRequest(method="PUT", url=f"{secured.data_url}/{auth_bucket}/upload/k",
                         data=b"")
    S3SigV4Auth(Credentials(AKID, SECRET), "s3", "eu-west-1").add_auth(request)
    status, body = fetch(request.url, {**dict(request.headers.items()),
                                       "X-Amz-Copy-Source": f"/{auth_bucket}/{KEY}"},
                         "PUT", b"")
    assert_access_denied(status, body, "not signed")
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=auth_bucket, Key="upload/k")
    # Both requests as signed pass.
    assert fetch(url, {}, "PUT", b"presigned")[0] == 200
    assert origin_s3.get_object(Bucket=auth_bucket, Key="upload/k")["Body"].read() == b"presigned"
    assert fetch(request.url, dict(request.headers.items()), "PUT", b"")[0] == 200


@pytest.mark.parametrize("trailer", [False, True])
def test_signed_aws_chunked_uploads_must_chain_to_their_signature(
    secured: SidecarProcess, auth_bucket: str, origin_s3: Any, trailer: bool
) -> None:
    data = os.urandom(3 * 65536 + 99)
    key = f"chunked/{trailer}.bin"
    url = f"{secured.data_url}/{auth_bucket}/{key}"
    headers, body = signed_chunked(url, data, 65536, AKID, SECRET, trailer, region="eu-west-1")
    middle = len(body) // 2  # inside the second chunk's data
    if trailer:  # another checksum of the same length: the trailer signature fails
        name, value = crc32_trailer(data)
        last = body.replace(f"{name}:{value}".encode(),
                            f"{name}:{crc32_trailer(b'other')[1]}".encode())
    else:  # the final, empty chunk's signature: every data byte was already sent
        final = body.rindex(b"0;chunk-signature=") + len(b"0;chunk-signature=")
        last = body[:final] + (b"1" if body[final:final + 1] == b"0" else b"0") + body[final + 1:]
    before = secured.metric("sidecar_auth_failures_total", reason="bad_signature")
    # The signed headers replayed with other bytes: refused, and nothing stored.
    for forged in (body[:middle] + bytes([body[middle] ^ 1]) + body[middle + 1:], last):
        assert len(forged) == len(body)
        status, answer = fetch(url, headers, "PUT", forged)
        assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in answer, answer
        with pytest.raises(ClientError):
            origin_s3.head_object(Bucket=auth_bucket, Key=key)
    assert secured.metric("sidecar_auth_failures_total", reason="bad_signature") == before + 2
    assert fetch(url, headers, "PUT", body)[0] == 200
    assert origin_s3.get_object(Bucket=auth_bucket, Key=key)["Body"].read() == data


def _send_json(url: str, method: str, body: object, headers: dict[str, str]) -> int:
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code


def test_mutating_admin_calls_need_the_token(secured: SidecarProcess, auth_bucket: str) -> None:
    mode_url = secured.admin_url + "/api/v1/mode"
    purge_url = f"{secured.admin_url}/api/v1/cache/{auth_bucket}/{KEY}"
    for token in (None, "wrong", ADMIN_TOKEN + "x", ADMIN_TOKEN[:-1]):
        assert _send_json(mode_url, "PUT", {"mode": "bypass"}, _bearer(token)) == 401
        assert _send_json(purge_url, "DELETE", {}, _bearer(token)) == 401
    assert secured.stats()["mode"] == "normal"
    assert _send_json(mode_url, "PUT", {"mode": "normal"}, _bearer(ADMIN_TOKEN)) == 200
    assert _send_json(purge_url, "DELETE", {}, _bearer(ADMIN_TOKEN)) == 200
    # Reading stays open, as the dashboards need.
    assert fetch(secured.admin_url + "/metrics")[0] == 200


def _bearer(token: str | None) -> dict[str, str]:
    return {"Content-Type": "application/json",
            **({"Authorization": f"Bearer {token}"} if token is not None else {})}


def test_no_secret_in_stderr_access_log_stats_or_metrics(
    secured: SidecarProcess, auth_bucket: str, secured_dir: Path
) -> None:
    access_log = secured_dir / "access.log"
    logged_before = access_log.read_text().count("\n") if access_log.exists() else 0
    # Provoke every refusal once more, with the secrets in play: three
    # data-port requests, three more lines in the access log.
    s3 = client(secured.data_url, AKID, SECRET2)
    try:
        with pytest.raises(ClientError):
            s3.get_object(Bucket=auth_bucket, Key=KEY)
    finally:
        s3.close()
    fetch(f"{secured.data_url}/{auth_bucket}/{KEY}",
          {"Authorization": f"AWS4-HMAC-SHA256 Credential={SECRET}/x, Signature={SECRET2}"})
    fetch(f"{secured.data_url}/{auth_bucket}/{KEY}?X-Amz-Signature={SECRET}&X-Amz-Algorithm=x")
    _send_json(secured.admin_url + "/api/v1/mode", "PUT", {"mode": "x"}, _bearer(SECRET))
    texts = {
        "stats": json.dumps(secured.stats()),
        "metrics": fetch(secured.admin_url + "/metrics")[1].decode(),
        "ui": fetch(secured.admin_url + "/ui")[1].decode(),
        "readyz": fetch(secured.admin_url + "/readyz")[1].decode(),
    }

    def their_lines_logged() -> str | None:
        text = access_log.read_text() if access_log.exists() else ""
        return text if text.count("\n") >= logged_before + 3 else None

    texts["access log"] = eventually(their_lines_logged, "the refusals in the access log",
                                     timeout=10, interval=0.1)
    texts["stderr"] = "".join(secured.stderr_lines)
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"a secret shows in {where}"


def test_by_default_only_the_sidecars_own_credentials_sign(
    local_s3: LocalS3, auth_bucket: str, tmp_path: Path, origin_s3: Any
) -> None:
    """No [auth] keys and nothing opted into: the data port is not open. The
    plugin's requests, signed with the credentials the sidecar reads the
    origin with, are served; unsigned and wrongly signed ones are refused,
    writes above all (they would reach the origin with those credentials)."""
    with SidecarProcess(
        local_s3.endpoint, tmp_path, "--block-size", "64KiB", "--cache-size", "8MiB",
        env={"SIDECAR_AUTH_ALLOW_ANONYMOUS": "false"},
    ) as sidecar:
        own = client(sidecar.data_url, CREDENTIALS["AWS_ACCESS_KEY_ID"],
                     CREDENTIALS["AWS_SECRET_ACCESS_KEY"])
        wrong = client(sidecar.data_url, CREDENTIALS["AWS_ACCESS_KEY_ID"], "not-the-secret")
        try:
            assert own.get_object(Bucket=auth_bucket, Key=KEY, Range="bytes=0-9")["Body"] \
                .read() == BODY[:10]
            own.put_object(Bucket=auth_bucket, Key="signed.bin", Body=b"by the plugin")
            assert origin_s3.get_object(Bucket=auth_bucket, Key="signed.bin")["Body"].read() \
                == b"by the plugin"
            with pytest.raises(ClientError) as caught:
                wrong.put_object(Bucket=auth_bucket, Key="forged.bin", Body=b"forged")
            assert caught.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        finally:
            own.close()
            wrong.close()
        assert_access_denied(*fetch(f"{sidecar.data_url}/{auth_bucket}/{KEY}"), "")
        assert_access_denied(*fetch(f"{sidecar.data_url}/{auth_bucket}/anonymous.bin",
                                    method="PUT", data=b"written by nobody"), "")
        assert_access_denied(*fetch(f"{sidecar.data_url}/{auth_bucket}/{KEY}",
                                    method="DELETE"), "")
        assert_access_denied(*fetch(
            f"{sidecar.data_url}/{auth_bucket}?delete", method="POST",
            data=f"<Delete><Object><Key>{KEY}</Key></Object></Delete>".encode()), "")
        for written in ("forged.bin", "anonymous.bin"):
            with pytest.raises(ClientError):
                origin_s3.head_object(Bucket=auth_bucket, Key=written)
        assert origin_s3.head_object(Bucket=auth_bucket, Key=KEY)["ContentLength"] == len(BODY)
        assert sidecar.metric("sidecar_auth_failures_total") >= 5


@pytest.mark.parametrize("env,says", [
    ({"SIDECAR_AUTH_KEYS": f"{AKID}:{SECRET},bad key:{SECRET2}"}, "entry 2: not AKID:SECRET"),
    ({"SIDECAR_AUTH_KEYS": f"{AKID}:{SECRET},{AKID}:{SECRET2}"}, "an access key id is given twice"),
    ({"SIDECAR_AUTH_KEYS": f"{AKID}:"}, "must be a non-empty string"),
    ({"SIDECAR_AUTH_KEYS_FILE": "/nonexistent/keys"}, "cannot read /nonexistent/keys"),
    ({"SIDECAR_ADMIN_LISTEN": "0.0.0.0:0"}, "--admin-token"),
])
def test_bad_auth_config_stops_start_up_without_showing_secrets(
    tmp_path: Path, env: dict[str, str], says: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "serve", "--cache-dir", str(tmp_path),
         "--origin-endpoint", "http://127.0.0.1:9", "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, **CREDENTIALS, "SIDECAR_ORIGIN_CHECK": "false", **env},
    )
    assert result.returncode == 2, result.stderr
    assert says in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback
    for secret in SECRETS:
        assert secret not in result.stderr + result.stdout


def test_auth_keys_from_a_toml_table(
    local_s3: LocalS3, auth_bucket: str, tmp_path: Path
) -> None:
    config = tmp_path / "sidecar.toml"
    config.write_text(f'[auth]\nkeys = {{ {AKID} = "{SECRET}" }}\n')
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(local_s3.endpoint, cache, "--config", str(config),
                        "--block-size", "64KiB", "--cache-size", "8MiB",
                        env={"SIDECAR_AUTH_ALLOW_ANONYMOUS": "false"}) as sidecar:
        assert fetch(f"{sidecar.data_url}/{auth_bucket}/{KEY}")[0] == 403
        s3 = client(sidecar.data_url, AKID, SECRET)
        try:
            assert s3.get_object(Bucket=auth_bucket, Key=KEY, Range="bytes=0-9")["Body"].read() \
                == BODY[:10]
        finally:
            s3.close()
