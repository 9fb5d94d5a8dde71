"""Numbers a client sends are ASCII digits of a bounded length, read without a 500,
and text logs keep a client's CR/LF from forging lines: on a running sidecar."""

from __future__ import annotations

import http.client
import json
import re
import socket
import urllib.parse
from pathlib import Path
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from tests.support.processes import SidecarProcess

AKID, SECRET = CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]


def send(url: str, method: str, path: str, headers: dict[str, str], body: bytes = b""
         ) -> tuple[int, bytes]:
    """A request whose header values go out as UTF-8 (http.client would send Latin-1)."""
    address = urllib.parse.urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value.encode())
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def signed_streaming_put(data_url: str, path: str, decoded_length: str) -> dict[str, str]:
    mode = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
    headers = {"x-amz-content-sha256": mode, "Content-Encoding": "aws-chunked",
               "x-amz-decoded-content-length": decoded_length, "Content-Length": "5"}
    request = AWSRequest(method="PUT", url=data_url + path, headers=headers, data=b"")
    signer = S3SigV4Auth(Credentials(AKID, SECRET), "s3", "us-east-1")
    signer.payload = lambda request: mode  # type: ignore[method-assign]
    signer.add_auth(request)
    # Signed as part of the URL; http.client is told not to add it itself.
    return {"Host": urllib.parse.urlsplit(data_url).netloc, **dict(request.headers.items())}


def test_client_numbers_that_int_would_take_or_choke_on_are_400s(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    with SidecarProcess(local_s3.endpoint, tmp_path) as sidecar:
        # x-amz-decoded-content-length: '²' passes str.isdigit(), int() refuses it,
        # and 5,000 digits exceed int()'s limit; '1_0' and '１０' int() takes.
        for length in ("²", "1" * 5000, "1_0", "１０", "+5", " 5 5"):
            path = f"/{bucket}/strict-{len(length)}"
            headers = signed_streaming_put(sidecar.data_url, path, length)
            status, answer = send(sidecar.data_url, "PUT", path, headers, b"0\r\n\r\n")
            assert status == 400, (length[:10], answer[:300])
            assert b"x-amz-decoded-content-length" in answer
        # A presigned URL's X-Amz-Expires of 5,000 digits: refused as malformed.
        query = urllib.parse.urlencode({
            "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
            "X-Amz-Credential": f"{AKID}/20261127/us-east-1/s3/aws4_request",
            "X-Amz-Date": "20261127T000000Z", "X-Amz-Expires": "9" * 5000,
            "X-Amz-SignedHeaders": "host", "X-Amz-Signature": "0" * 64})
        status, answer = send(sidecar.data_url, "GET", f"/{bucket}/k?{query}",
                              {"Host": "127.0.0.1"})
        assert status == 403 and b"X-Amz-Expires" in answer, answer[:300]
        # The admin port: a JSON integer of 5,000 digits, a since= int() would read.
        token = sidecar.admin_token
        body = b'{"objects": [{"bucket": "%s", "key": "k", "start": %s}]}' % (
            bucket.encode(), b"7" * 5000)
        status, answer = send(sidecar.admin_url, "POST", "/api/v1/warm",
                              {"Host": "127.0.0.1", "Authorization": f"Bearer {token}",
                               "Content-Type": "application/json",
                               "Content-Length": str(len(body))}, body)
        assert status == 400 and "too long" in json.loads(answer)["error"], answer[:300]
        for since in ("1_0", "١٠", " 1 ", "1e3"):
            status, answer = send(sidecar.admin_url, "GET",
                                  f"/api/v1/stats?since={urllib.parse.quote(since)}",
                                  {"Host": "127.0.0.1"})
            assert status == 400 and b"since" in answer, since
        # Content-Length is aiohttp's to read: the same lookalikes are a 400 there.
        for length in ("\u0661\u0660", "1_0", "+10", "9" * 5000):
            raw = (f"PUT /{bucket}/k HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
                   "0123456789").encode()
            address = urllib.parse.urlsplit(sidecar.data_url)
            with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
                sock.sendall(raw)
                assert re.match(rb"HTTP/1\.[01] 400 ", sock.recv(65536)), length[:10]
        assert sidecar.metric("sidecar_requests_total", code="500") == 0
        assert not [line for line in sidecar.stderr_lines if "Traceback" in line]


def test_a_key_with_cr_lf_forges_no_line_in_the_text_log(
    local_s3: LocalS3, origin_s3: Any, bucket: str, tmp_path: Path
) -> None:
    # A CR returns a terminal's cursor to the line's start (the forged text then
    # covers the real one), U+2028 and NEL break lines in some viewers, CSI (the
    # C1 form of ESC [) drives a terminal. (The origin here takes no LF in a key,
    # the data port no C0 control but CR, LF and TAB; the formatter's unit test
    # covers them.)
    key = "forge\r2026-11-27 00:00:00,000 ERROR sidecar: FORGED\u2028\x85\x9b2J"
    origin_s3.put_object(Bucket=bucket, Key=key, Body=b"x" * 1000)
    sidecar = SidecarProcess(local_s3.endpoint, tmp_path,
                             env={"SIDECAR_LOG_FORMAT": "text", "SIDECAR_LOG_LEVEL": "DEBUG"})
    with sidecar:
        status, body = send(sidecar.data_url, "GET",
                            f"/{bucket}/{urllib.parse.quote(key, safe='')}",
                            {"Host": "127.0.0.1"})
        assert status == 200 and body == b"x" * 1000
    # The miss is logged at DEBUG with the key: one line, its controls escaped.
    logged = [line for line in sidecar.stderr_lines if "FORGED" in line]
    assert logged, "".join(sidecar.stderr_lines)[-2000:]
    for line in logged:
        assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ sidecar\.", line), line
        assert not line.startswith("2026-11-27 00:00:00,000"), line
        assert "forge\\r2026" in line and "FORGED\\u2028\\x85\\x9b2J" in line
        assert not set(line.rstrip("\n")) & {"\r", "\x9b", "\u2028", "\x85"}
