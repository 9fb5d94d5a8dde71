"""Pass-through: everything but a plain object GET/HEAD reaches the origin,
re-signed with the sidecar's credentials (checked by a verifying proxy in front
of moto), and writes and deletes invalidate what the cache held."""

from __future__ import annotations

import base64
import http.client
import json
import os
import random
import secrets
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from sidecar.tools.kafka_segments import generate_topic_segments, iter_segment_batches
from sidecar.tools.local_s3 import CREDENTIALS, loopback_client
from tests.support.processes import SidecarProcess
from tests.support.s3_clients import s3_client
from tests.support.signed_chunks import crc32_trailer, signed_chunked
from tests.support.verifying_proxy import VerifyingProxy
from tests.support.waiting import eventually

BLOCK = 64 * 1024
MOTO_KEY = (CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


@pytest.fixture(scope="module")
def sidecar(verifying: VerifyingProxy, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[SidecarProcess]:
    cache = tmp_path_factory.mktemp("passthrough-cache")
    with SidecarProcess(
        verifying.endpoint, cache, "--block-size", "64KiB",
        "--cache-size", str(64 * (BLOCK + 4096)), env={"SIDECAR_PREFETCH": "false"},
    ) as process:
        yield process


@pytest.fixture(autouse=True)
def _signatures_hold(verifying: VerifyingProxy) -> Iterator[None]:
    yield
    assert verifying.failures == [], verifying.failures


def signed(url: str, method: str, path: str, headers: dict[str, str]) -> dict[str, str]:
    """`headers` with a SigV4 signature by the sidecar's own origin credentials
    (what the plugin signs with), over the payload hash the headers declare
    (UNSIGNED-PAYLOAD if none), so a test can send a body as it likes."""
    declared = next((value for name, value in headers.items()
                     if name.lower() == "x-amz-content-sha256"), "UNSIGNED-PAYLOAD")
    request = AWSRequest(method=method, url=url + path,
                         headers={name: value for name, value in headers.items()
                                  if name.lower() != "x-amz-content-sha256"})
    signer = S3SigV4Auth(Credentials(*MOTO_KEY), "s3", "us-east-1")
    signer.payload = lambda request: declared  # type: ignore[method-assign]
    signer.add_auth(request)
    return dict(request.headers.items())


def raw(url: str, method: str, path: str, headers: dict[str, str] | None = None,
        body: bytes | None = None, sign: bool = True) -> tuple[int, dict[str, str], bytes]:
    """One request, signed unless it carries a signature or `sign` is False."""
    headers = dict(headers or {})
    if sign and "Authorization" not in headers:
        headers = signed(url, method, path, headers)
    address = urlsplit(url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        connection.close()


def cached_blocks(sidecar: SidecarProcess) -> int:
    return int(sidecar.metric("sidecar_cache_blocks"))


def cached_blocks_reach(sidecar: SidecarProcess, expect: int) -> None:
    """Blocks land in the cache just after their bytes went to the client: wait
    (10 s at most) until `expect` of them are there."""
    eventually(lambda: cached_blocks(sidecar) == expect, f"{expect} blocks in the cache",
               timeout=10, interval=0.02)


def test_a_write_through_the_sidecar_reads_back_at_once(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, verifying: VerifyingProxy
) -> None:
    client = s3_client(sidecar.data_url)
    old, new = random.Random(1).randbytes(3 * BLOCK + 5), random.Random(2).randbytes(2 * BLOCK)
    origin_s3.put_object(Bucket=bucket, Key="seg.log", Body=old)
    blocks_before = cached_blocks(sidecar)
    assert client.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == old
    cached_blocks_reach(sidecar, blocks_before + 4)
    client.put_object(Bucket=bucket, Key="seg.log", Body=new)
    # The old version's blocks and its remembered HEAD are gone at once.
    assert cached_blocks(sidecar) == blocks_before
    assert origin_s3.get_object(Bucket=bucket, Key="seg.log")["Body"].read() == new
    got = client.get_object(Bucket=bucket, Key="seg.log", Range="bytes=10-")
    assert got["Body"].read() == new[10:]
    assert sidecar.metric("sidecar_requests_total", op="PutObject", code="200") >= 1
    assert any(method == "PUT" for method, _, _ in verifying.verified)


def test_tags_written_through_the_sidecar_show_in_its_next_answer(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    # Every GET and HEAD repeats the object's tag count; a tagging write leaves
    # its bytes and ETag alone: the remembered HEAD goes, the blocks stay.
    client = s3_client(sidecar.data_url)
    data = random.Random(3).randbytes(2 * BLOCK)
    origin_s3.put_object(Bucket=bucket, Key="tagged.log", Body=data)
    blocks_before = cached_blocks(sidecar)
    first = client.get_object(Bucket=bucket, Key="tagged.log")
    assert first["Body"].read() == data and "TagCount" not in first
    cached_blocks_reach(sidecar, blocks_before + 2)
    client.put_object_tagging(Bucket=bucket, Key="tagged.log",
                              Tagging={"TagSet": [{"Key": "tier", "Value": "cold"}]})
    tagged = client.get_object(Bucket=bucket, Key="tagged.log")
    assert tagged["Body"].read() == data and tagged.get("TagCount") == 1
    assert tagged["ResponseMetadata"]["HTTPHeaders"]["x-sidecar-cache"] == "hit"
    client.delete_object_tagging(Bucket=bucket, Key="tagged.log")
    assert "TagCount" not in client.head_object(Bucket=bucket, Key="tagged.log")
    assert cached_blocks(sidecar) == blocks_before + 2


def test_bucket_and_sub_resource_operations_reach_the_origin(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    client = s3_client(sidecar.data_url)
    for key in ("a/1", "a/2", "b/3 with space+plus"):
        client.put_object(Bucket=bucket, Key=key, Body=key.encode(), Tagging="k=v")
    listed = client.list_objects_v2(Bucket=bucket, Prefix="a/")
    assert [item["Key"] for item in listed["Contents"]] == ["a/1", "a/2"]
    everything = client.list_objects_v2(Bucket=bucket)["Contents"]
    at_origin = origin_s3.list_objects_v2(Bucket=bucket)["Contents"]
    assert [(i["Key"], i["ETag"], i["Size"]) for i in everything] == \
        [(i["Key"], i["ETag"], i["Size"]) for i in at_origin]
    prefixes = client.list_objects(Bucket=bucket, Delimiter="/")["CommonPrefixes"]
    assert [p["Prefix"] for p in prefixes] == ["a/", "b/"]
    client.head_bucket(Bucket=bucket)
    assert bucket in [b["Name"] for b in client.list_buckets()["Buckets"]]
    assert client.get_object_tagging(Bucket=bucket, Key="a/1")["TagSet"] == \
        [{"Key": "k", "Value": "v"}]
    assert client.get_object(Bucket=bucket, Key="b/3 with space+plus")["Body"].read() == \
        b"b/3 with space+plus"
    client.copy_object(Bucket=bucket, Key="a/copy", CopySource={"Bucket": bucket, "Key": "a/1"})
    assert origin_s3.get_object(Bucket=bucket, Key="a/copy")["Body"].read() == b"a/1"
    client.delete_object(Bucket=bucket, Key="a/copy")
    with pytest.raises(ClientError) as caught:
        origin_s3.head_object(Bucket=bucket, Key="a/copy")
    assert caught.value.response["Error"]["Code"] == "404"
    with pytest.raises(ClientError) as caught:
        client.list_objects_v2(Bucket="no-such-bucket-" + secrets.token_hex(3))
    assert caught.value.response["Error"]["Code"] == "NoSuchBucket"
    assert sidecar.metric("sidecar_requests_total", op="ListObjectsV2", code="200") >= 2
    assert sidecar.metric("sidecar_requests_total", op="HeadBucket", code="200") >= 1


def test_multipart_upload_and_abort(sidecar: SidecarProcess, origin_s3: Any, bucket: str) -> None:
    client = s3_client(sidecar.data_url)
    parts = [random.Random(i).randbytes(5 * 1024 * 1024 if i < 2 else 1234) for i in range(3)]
    upload = client.create_multipart_upload(Bucket=bucket, Key="big.log")["UploadId"]
    assert [u["UploadId"] for u in client.list_multipart_uploads(Bucket=bucket)["Uploads"]] \
        == [upload]
    etags = [
        client.upload_part(Bucket=bucket, Key="big.log", UploadId=upload, PartNumber=n + 1,
                           Body=part)["ETag"]
        for n, part in enumerate(parts)
    ]
    assert [p["ETag"] for p in client.list_parts(Bucket=bucket, Key="big.log",
                                                 UploadId=upload)["Parts"]] == etags
    client.complete_multipart_upload(
        Bucket=bucket, Key="big.log", UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n + 1} for n, e in enumerate(etags)]},
    )
    whole = b"".join(parts)
    assert origin_s3.get_object(Bucket=bucket, Key="big.log")["Body"].read() == whole
    assert client.get_object(Bucket=bucket, Key="big.log", Range="bytes=5242000-5243000")[
        "Body"].read() == whole[5242000:5243001]
    aborted = client.create_multipart_upload(Bucket=bucket, Key="gone.log")["UploadId"]
    client.abort_multipart_upload(Bucket=bucket, Key="gone.log", UploadId=aborted)
    assert "Uploads" not in origin_s3.list_multipart_uploads(Bucket=bucket)


def test_delete_objects_invalidates_every_listed_key(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    client = s3_client(sidecar.data_url)
    keys = [f"d/{n}" for n in range(3)]
    for key in keys:
        origin_s3.put_object(Bucket=bucket, Key=key, Body=random.Random(key).randbytes(BLOCK + 1))
    before = cached_blocks(sidecar)
    for key in keys:
        client.get_object(Bucket=bucket, Key=key)["Body"].read()
    cached_blocks_reach(sidecar, before + 6)
    answer = client.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys]})
    assert sorted(d["Key"] for d in answer["Deleted"]) == keys
    assert cached_blocks(sidecar) == before
    for key in keys:
        with pytest.raises(ClientError) as caught:
            client.get_object(Bucket=bucket, Key=key)
        assert caught.value.response["Error"]["Code"] == "NoSuchKey"


def test_replaced_and_unsupported_requests(sidecar: SidecarProcess, bucket: str) -> None:
    # What the old data port refused now reaches the origin.
    assert raw(sidecar.data_url, "PUT", f"/{bucket}/k", body=b"")[0] == 200
    status, _, body = raw(sidecar.data_url, "POST", f"/{bucket}/k?uploads")
    assert status == 200 and b"<UploadId>" in body
    status, _, body = raw(sidecar.data_url, "GET", f"/{bucket}/k?acl")
    assert status == 200 and b"AccessControlPolicy" in body
    status, _, body = raw(sidecar.data_url, "GET", f"/{bucket}")
    assert status == 200 and b"<Key>k</Key>" in body
    assert raw(sidecar.data_url, "DELETE", f"/{bucket}/k")[0] == 204
    # A DeleteObjects body larger than S3 allows is refused without reaching the origin.
    status, _, body = raw(sidecar.data_url, "POST", f"/{bucket}?delete",
                          body=b"<Delete>" + b" " * (3 * 1024 * 1024) + b"</Delete>")
    assert status == 400 and b"<Code>MaxMessageLengthExceeded</Code>" in body
    status, _, body = raw(sidecar.data_url, "PUT", f"/{bucket}/k",
                          {"x-amz-content-sha256": "not-a-hash"}, body=b"x")
    assert status == 403 and b"is not a SHA-256 or a known payload mode" in body


@pytest.mark.parametrize("trailer", [False, True])
def test_signed_aws_chunked_uploads_are_decoded(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, trailer: bool,
    verifying: VerifyingProxy,
) -> None:
    data = random.Random(7).randbytes(3 * 65536 + 99)
    headers, body = signed_chunked(f"{sidecar.data_url}/{bucket}/chunked.bin", data, 65536,
                                   *MOTO_KEY, trailer=trailer)
    status, _, answer = raw(sidecar.data_url, "PUT", f"/{bucket}/chunked.bin", headers, body)
    assert status == 200, answer
    assert origin_s3.get_object(Bucket=bucket, Key="chunked.bin")["Body"].read() == data
    sent = [h for m, p, h in verifying.verified if m == "PUT" and "chunked.bin" in p][-1]
    assert sent == ("STREAMING-UNSIGNED-PAYLOAD-TRAILER" if trailer else "UNSIGNED-PAYLOAD")
    # A body cut short of its declared framing is refused, and nothing is stored.
    headers, body = signed_chunked(f"{sidecar.data_url}/{bucket}/broken.bin", data, 65536,
                                   *MOTO_KEY, trailer=trailer, cut=10)
    status, _, answer = raw(sidecar.data_url, "PUT", f"/{bucket}/broken.bin", headers, body)
    assert status == 400 and b"IncompleteBody" in answer, answer
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=bucket, Key="broken.bin")


@pytest.mark.parametrize("trailer", [False, True])
def test_an_over_long_or_forged_signed_chunked_body_never_completes_at_the_origin(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, trailer: bool,
) -> None:
    # Every chunk signature holds, but the signed x-amz-decoded-content-length
    # says 64 KiB of the 1 MiB sent: the origin was told 64 KiB, and a piece
    # held back at the end of the body would fall far past it.
    data = random.Random(11).randbytes(16 * 65536)
    key = f"over-long-{trailer}.bin"
    headers, body = signed_chunked(f"{sidecar.data_url}/{bucket}/{key}", data, 65536,
                                   *MOTO_KEY, trailer=trailer, declared=65536)
    status, _, answer = raw(sidecar.data_url, "PUT", f"/{bucket}/{key}", headers, body)
    assert status == 400 and b"<Code>IncompleteBody</Code>" in answer, answer
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=bucket, Key=key)
    # The right length, and a final (empty) chunk whose signature is forged:
    # every data byte arrives before the chain is seen to break.
    headers, body = signed_chunked(f"{sidecar.data_url}/{bucket}/{key}", data, 65536,
                                   *MOTO_KEY, trailer=trailer)
    final = body.rindex(b"0;chunk-signature=") + len(b"0;chunk-signature=")
    forged = body[:final] + (b"1" if body[final:final + 1] == b"0" else b"0") + body[final + 1:]
    status, _, answer = raw(sidecar.data_url, "PUT", f"/{bucket}/{key}", headers, forged)
    assert status == 403 and b"<Code>SignatureDoesNotMatch</Code>" in answer, answer
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=bucket, Key=key)


def test_a_connection_header_naming_a_signed_header_is_refused(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str,
) -> None:
    # A proxy drops the fields Connection names (RFC 9110 7.6.1): a signed
    # x-amz-* one would reach the origin without what the client signed.
    headers = {"x-amz-meta-owner": "payments", "Connection": "x-amz-meta-owner"}
    status, _, answer = raw(sidecar.data_url, "PUT", f"/{bucket}/conn.bin", headers, b"x")
    assert status == 400 and b"x-amz-meta-owner" in answer, answer
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=bucket, Key="conn.bin")
    # An unsigned field it names is dropped, as before.
    status, _, answer = raw(sidecar.data_url, "PUT", f"/{bucket}/conn.bin",
                            {"Connection": "x-private"}, b"x")
    assert status == 200, answer


def _head_of_answer(connection: socket.socket) -> bytes:
    """Bytes up to the end of the next header block (an interim 100 or the
    final answer's), or all until the sidecar closes; 10 s at most."""
    connection.settimeout(10)
    received = b""
    while b"\r\n\r\n" not in received:
        piece = connection.recv(1)
        if not piece:
            break
        received += piece
    return received


def test_expect_100_continue_is_answered_only_once_the_body_is_wanted(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str,
) -> None:
    # RFC 9110 section 10.1.1: a client that expects 100-continue waits for it
    # before sending its body; a request refused must be refused before then,
    # or a 5 GiB upload goes to waste (and with it the sidecar's bandwidth).
    address = urlsplit(sidecar.data_url)
    refused = (f"PUT /{bucket}/expect.bin HTTP/1.1\r\nHost: {address.netloc}\r\n"
               f"Content-Length: {5 * 1024 ** 3}\r\nExpect: 100-continue\r\n\r\n")
    with socket.create_connection((address.hostname, address.port)) as connection:
        connection.sendall(refused.encode())  # unsigned: anonymous requests only read
        head = _head_of_answer(connection)
        assert head.startswith(b"HTTP/1.1 403 "), head
        # The body never asked for may follow or not: the connection ends here.
        assert b"\r\nConnection: close\r\n" in head, head
    # A request let through gets its 100 and stores what follows it.
    headers = signed(sidecar.data_url, "PUT", f"/{bucket}/expect.bin",
                     {"Content-Length": "5", "Expect": "100-continue"})
    accepted = f"PUT /{bucket}/expect.bin HTTP/1.1\r\nHost: {address.netloc}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()) + "\r\n"
    with socket.create_connection((address.hostname, address.port)) as connection:
        connection.sendall(accepted.encode())
        assert _head_of_answer(connection) == b"HTTP/1.1 100 Continue\r\n\r\n"
        connection.sendall(b"hello")
        assert _head_of_answer(connection).startswith(b"HTTP/1.1 200 ")
    assert origin_s3.get_object(Bucket=bucket, Key="expect.bin")["Body"].read() == b"hello"


def test_the_query_reaches_the_origin_as_signed(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str,
) -> None:
    # The signature takes a literal '+' (SigV4 encodes it as %2B); form
    # decoding would turn it into a space and list another prefix.
    for key in ("a+b/1", "a b/2"):
        origin_s3.put_object(Bucket=bucket, Key=key, Body=b"x")
    status, _, answer = raw(sidecar.data_url, "GET", f"/{bucket}?list-type=2&prefix=a+b")
    assert status == 200, answer
    assert b"<Key>a+b/1</Key>" in answer and b"a b/2" not in answer, answer


@pytest.mark.parametrize("query", [
    "list-type=2&policy", "uploads&policy", "versions&acl", "location&policy",
    "list-type=2&uploads", "policy", "acl",
])
def test_unknown_sub_resources_are_never_anonymous_reads(
    sidecar: SidecarProcess, bucket: str, query: str,
) -> None:
    status, _, answer = raw(sidecar.data_url, "GET", f"/{bucket}?{query}", sign=False)
    assert status == 403 and b"<Code>AccessDenied</Code>" in answer, (query, answer)
    # Listings, uploads and versions on their own stay readable.
    for read in ("list-type=2&prefix=x", "uploads", "versions", "location"):
        assert raw(sidecar.data_url, "GET", f"/{bucket}?{read}", sign=False)[0] == 200, read


def _unsigned_trailer_body(data: bytes, chunk: int) -> bytes:
    """STREAMING-UNSIGNED-PAYLOAD-TRAILER framing with a CRC-32 trailer."""
    name, value = crc32_trailer(data)
    framed = b"".join(b"%x\r\n%s\r\n" % (len(data[i:i + chunk]), data[i:i + chunk])
                      for i in range(0, len(data), chunk))
    return framed + f"0\r\n{name}:{value}\r\n\r\n".encode()


@pytest.mark.parametrize("framing", ["unsigned-trailer", "signed-trailer"])
def test_delete_objects_sent_aws_chunked_invalidates_every_listed_key(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, framing: str
) -> None:
    # Unsigned-trailer bodies go to the origin as sent, signed ones re-framed:
    # either way framing, so the keys must come from the decoded XML.
    client = s3_client(sidecar.data_url)
    keys = [f"{framing}/{n}" for n in range(2)]
    for key in keys:
        origin_s3.put_object(Bucket=bucket, Key=key, Body=random.Random(key).randbytes(BLOCK + 1))
    before = cached_blocks(sidecar)
    for key in keys:
        client.get_object(Bucket=bucket, Key=key)["Body"].read()
    cached_blocks_reach(sidecar, before + 4)
    xml = ("<Delete>" + "".join(f"<Object><Key>{k}</Key></Object>" for k in keys)
           + "</Delete>").encode()
    if framing == "unsigned-trailer":
        headers = {"x-amz-content-sha256": "STREAMING-UNSIGNED-PAYLOAD-TRAILER",
                   "Content-Encoding": "aws-chunked", "x-amz-trailer": "x-amz-checksum-crc32",
                   "x-amz-decoded-content-length": str(len(xml))}
        body = _unsigned_trailer_body(xml, 16)
    else:
        headers, body = signed_chunked(f"{sidecar.data_url}/{bucket}?delete", xml, 16,
                                       *MOTO_KEY, trailer=True, method="POST")
    status, _, answer = raw(sidecar.data_url, "POST", f"/{bucket}?delete", headers, body)
    assert status == 200 and answer.count(b"<Deleted>") == 2, answer
    assert cached_blocks(sidecar) == before
    for key in keys:
        with pytest.raises(ClientError) as caught:
            client.get_object(Bucket=bucket, Key=key)
        assert caught.value.response["Error"]["Code"] == "NoSuchKey"


def test_a_sigv2_presigned_get_is_refused_and_never_forwarded(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str, verifying: VerifyingProxy
) -> None:
    # SigV2 (AWSAccessKeyId, Signature, Expires in the query) cannot be checked
    # here, and S3 refuses requests authenticated twice: refused with S3's
    # words, and the origin never sees it.
    data = random.Random(9).randbytes(BLOCK + 7)
    origin_s3.put_object(Bucket=bucket, Key="v2.log", Body=data)
    v2 = loopback_client(sidecar.data_url, signature_version="s3")
    try:
        url = v2.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": "v2.log"}, ExpiresIn=300)
    finally:
        v2.close()
    assert "AWSAccessKeyId=" in url and "Signature=" in url and "Expires=" in url
    status, _, body = raw(sidecar.data_url, "GET", url.partition(sidecar.data_url)[2],
                          {"Range": "bytes=3-12"}, sign=False)
    assert status == 403 and b"Signature Version 4" in body
    assert not [path for _, path, _ in verifying.verified
                if {"AWSAccessKeyId", "Signature", "Expires"}
                & set(dict(parse_qsl(path.partition("?")[2])))]


def closed_port_url() -> str:
    """A loopback URL nothing listens on (a port bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_an_unreachable_origin_gets_service_unavailable(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(closed_port_url(), cache, "--block-size", "64KiB", "--cache-size", "1MiB",
                        env={"SIDECAR_ORIGIN_CHECK": "false",
                             "SIDECAR_ORIGIN_CONNECT_TIMEOUT": "1s",
                             "SIDECAR_ORIGIN_RETRIES": "0"}) as process:
        status, headers, body = raw(process.data_url, "PUT", "/some-bucket/k", body=b"abc")
        assert status == 503 and b"<Code>ServiceUnavailable</Code>" in body
        assert headers["content-type"].startswith("application/xml")


def test_replay_lists_through_the_sidecar_without_a_list_endpoint(
    sidecar: SidecarProcess, origin_s3: Any, bucket: str
) -> None:
    segments = list(generate_topic_segments(
        topic="audit", partitions=1, segments_per_partition=2, segment_bytes=512 * 1024,
        value_size=1024, seed=5,
    ))
    for segment in segments:
        origin_s3.put_object(Bucket=bucket, Key=segment.key, Body=segment.data)
    listed = sidecar.metric("sidecar_requests_total", op="ListObjectsV2", code="200")
    result = subprocess.run(
        [sys.executable, "-m", "sidecar", "replay", "--endpoint", sidecar.data_url,
         "--bucket", bucket, "--admin", sidecar.admin_url, "--json"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, **CREDENTIALS, "SIDECAR_LOG_LEVEL": "WARNING"},
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["crc_errors"] == 0 and report["segments"] == 2
    assert report["records"] == sum(h.record_count for s in segments
                                    for h in iter_segment_batches(s.data))
    assert sidecar.metric("sidecar_requests_total", op="ListObjectsV2", code="200") > listed


def _access_line(path: Path, method: str, key: str) -> dict[str, Any] | None:
    """The access log's line of the request `method` of `key`, once written."""
    if not path.exists():
        return None
    for text in path.read_text().splitlines():
        line: dict[str, Any] = json.loads(text)
        if (line["method"], line["key"]) == (method, key):
            return line
    return None


def test_a_passed_through_answer_carries_the_ids_its_access_log_line_has(
    verifying: VerifyingProxy, bucket: str, tmp_path: Path
) -> None:
    """A passed-through answer carried the origin's request id (moto's
    x-amzn-requestid, which botocore reads first, or S3's x-amz-request-id)
    while its access log line had the sidecar's: the id a client reported was
    nowhere in the sidecar's logs. Now the client gets the sidecar's ids, in the
    headers and in an error body alike, and the sidecar's log line of an error
    answer names the origin's, with the sidecar's request id on it."""
    log_path = tmp_path / "access.jsonl"
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(
        verifying.endpoint, cache, "--block-size", "64KiB", "--cache-size", str(4 * (BLOCK + 4096)),
        "--access-log", str(log_path),
        env={"SIDECAR_PREFETCH": "false", "SIDECAR_LOG_LEVEL": "INFO"},
    ) as sidecar:
        client = s3_client(sidecar.data_url)
        written = client.put_object(Bucket=bucket, Key="ids.log", Body=b"0123456789")
        line = eventually(lambda: _access_line(log_path, "PUT", "ids.log"), "the PUT's line")
        assert line["status"] == 200
        assert written["ResponseMetadata"]["RequestId"] == line["request_id"]
        host_id = written["ResponseMetadata"]["HostId"]
        assert len(base64.b64decode(host_id, validate=True)) == 48  # the sidecar's, as its own
        with pytest.raises(ClientError) as caught:
            client.get_object_tagging(Bucket=bucket, Key="missing.log")
        refused = caught.value.response
        assert refused["Error"]["Code"] == "NoSuchKey"
        line = eventually(lambda: _access_line(log_path, "GET", "missing.log"), "the GET's line")
        assert line["status"] == 404
        assert refused["ResponseMetadata"]["RequestId"] == line["request_id"]
        assert len(base64.b64decode(refused["ResponseMetadata"]["HostId"], validate=True)) == 48
        # The error body repeats the headers' ids, as the sidecar's own errors do.
        status, headers, body = raw(sidecar.data_url, "GET", f"/{bucket}/missing.log?tagging")
        assert status == 404 and b"<Code>NoSuchKey</Code>" in body
        assert "x-amzn-requestid" not in headers
        assert (f"<RequestId>{headers['x-amz-request-id']}</RequestId>"
                f"<HostId>{headers['x-amz-id-2']}</HostId>").encode() in body
        assert headers["content-length"] == str(len(body))
    origin_ids = [answer["x-amzn-requestid"] for method, path, answer in verifying.answers
                  if method == "GET" and path.startswith(f"/{bucket}/missing.log?tagging")]
    assert len(origin_ids) == 2
    records = [json.loads(text) for text in sidecar.stderr_lines if text.startswith("{")]
    for origin_id, ours in zip(origin_ids, (line["request_id"], headers["x-amz-request-id"]),
                               strict=True):
        assert origin_id not in body.decode()
        named = [record for record in records if record.get("origin_request_id") == origin_id]
        assert len(named) == 1, records
        assert named[0]["request_id"] == ours and "404 NoSuchKey" in named[0]["msg"]
