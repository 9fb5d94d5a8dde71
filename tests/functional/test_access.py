"""What the data port serves at all ([access] and [auth] scopes), against a
running sidecar in front of moto: only the served bucket, no bucket
administration (nor its rights by ACL headers on writes), copies only from
served buckets, scoped keys, and anonymous callers that never list the
buckets nor override an answer's headers. The origin is watched through a recording
proxy: a refused request never reaches it."""

from __future__ import annotations

import http.client
import json
import secrets
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

from sidecar.tools.local_s3 import CREDENTIALS, LocalS3
from tests.support.processes import SidecarProcess
from tests.support.recording_proxy import RecordingProxy
from tests.support.s3_clients import s3_client

READER, READER_SECRET = "AKIDREADER", "reader-secret-Qm4x"
WRITER, WRITER_SECRET = "AKIDWRITER", "writer-secret-Lp7z"
OWN = (CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"])


@pytest.fixture(scope="module")
def buckets(origin_s3: Any) -> tuple[str, str]:
    """(served, other): both exist at the origin, with one object each."""
    served, other = (f"{name}-{secrets.token_hex(4)}" for name in ("served", "other"))
    for bucket in (served, other):
        origin_s3.create_bucket(Bucket=bucket)
        origin_s3.put_object(Bucket=bucket, Key="seg.log", Body=bucket.encode())
    return served, other


@pytest.fixture(scope="module")
def recorder(local_s3: LocalS3) -> Iterator[RecordingProxy]:
    with RecordingProxy(local_s3.endpoint) as proxy:
        yield proxy


@pytest.fixture(scope="module")
def sidecar(recorder: RecordingProxy, buckets: tuple[str, str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    served, _ = buckets
    cache = tmp_path_factory.mktemp("access-cache")
    with SidecarProcess(
        recorder.endpoint, cache, "--block-size", "64KiB", "--cache-size", "8MiB",
        env={"SIDECAR_ACCESS_BUCKETS": served,
             "SIDECAR_AUTH_KEYS": f"{READER}:{READER_SECRET},{WRITER}:{WRITER_SECRET}",
             "SIDECAR_AUTH_SCOPES": f"{READER}=read:{served};{WRITER}=read-write"},
    ) as process:
        yield process


def client(sidecar: SidecarProcess, key: tuple[str, str] = OWN) -> Any:
    return s3_client(sidecar.data_url, key=key[0], secret=key[1])


def denied(call: Any, **kwargs: Any) -> str:
    """The message of the 403 AccessDenied that `call(**kwargs)` must get."""
    with pytest.raises(ClientError) as caught:
        call(**kwargs)
    error = caught.value.response["Error"]
    assert (caught.value.response["ResponseMetadata"]["HTTPStatusCode"], error["Code"]) == \
        (403, "AccessDenied"), caught.value.response
    return str(error.get("Message", ""))


def unsigned(url: str, method: str = "GET") -> tuple[int, bytes]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


def test_only_the_served_bucket_reaches_the_origin(
    sidecar: SidecarProcess, recorder: RecordingProxy, buckets: tuple[str, str]
) -> None:
    served, other = buckets
    s3 = client(sidecar)
    assert s3.get_object(Bucket=served, Key="seg.log")["Body"].read() == served.encode()
    recorder.clear()
    assert "does not serve bucket" in denied(s3.get_object, Bucket=other, Key="seg.log")
    denied(s3.list_objects_v2, Bucket=other)
    denied(s3.put_object, Bucket=other, Key="x", Body=b"x")
    denied(s3.delete_objects, Bucket=other, Delete={"Objects": [{"Key": "seg.log"}]})
    assert [r for r in recorder.requests if other in r.path] == []
    assert sidecar.metric("sidecar_access_denied_total", op="GetObject") >= 1
    assert sidecar.metric("sidecar_access_denied_total", op="DeleteObjects") >= 1


def test_bucket_administration_is_refused_before_the_origin(
    sidecar: SidecarProcess, recorder: RecordingProxy, buckets: tuple[str, str],
    origin_s3: Any,
) -> None:
    served, _ = buckets
    s3 = client(sidecar)
    recorder.clear()
    denied(s3.create_bucket, Bucket=served)
    denied(s3.delete_bucket, Bucket=served)
    policy = {"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": "*", "Action": "s3:GetObject",
        "Resource": f"arn:aws:s3:::{served}/*"}]}
    denied(s3.put_bucket_policy, Bucket=served, Policy=json.dumps(policy))
    denied(s3.put_bucket_acl, Bucket=served, ACL="public-read")
    denied(s3.put_object_acl, Bucket=served, Key="seg.log", ACL="public-read")
    # The same rights by headers, on writes a write key may otherwise make: an
    # upload, a copy of an object onto itself, a multipart upload, a delete
    # past governance retention.
    writer = client(sidecar, (WRITER, WRITER_SECRET))
    assert "Setting x-amz-acl: public-read is not allowed" in denied(
        writer.put_object, Bucket=served, Key="pub", Body=b"x", ACL="public-read")
    denied(writer.copy_object, Bucket=served, Key="seg.log", ACL="public-read",
           MetadataDirective="REPLACE", CopySource={"Bucket": served, "Key": "seg.log"})
    assert "x-amz-grant-read" in denied(
        writer.create_multipart_upload, Bucket=served, Key="pub",
        GrantRead='uri="http://acs.amazonaws.com/groups/global/AllUsers"')
    denied(s3.delete_object, Bucket=served, Key="seg.log", BypassGovernanceRetention=True)
    assert recorder.requests == []
    # An uploader's default canned ACL grants no one else: it passes.
    writer.put_object(Bucket=served, Key="owned", Body=b"o", ACL="bucket-owner-full-control")
    assert origin_s3.head_bucket(Bucket=served)["ResponseMetadata"]["HTTPStatusCode"] == 200
    grants = origin_s3.get_object_acl(Bucket=served, Key="seg.log")["Grants"]
    assert not any("AllUsers" in str(grant) for grant in grants), grants


def test_a_copy_reads_only_served_buckets(
    sidecar: SidecarProcess, buckets: tuple[str, str], origin_s3: Any
) -> None:
    served, other = buckets
    s3 = client(sidecar)
    denied(s3.copy_object, Bucket=served, Key="stolen", CopySource={"Bucket": other,
                                                                   "Key": "seg.log"})
    with pytest.raises(ClientError):
        origin_s3.head_object(Bucket=served, Key="stolen")
    s3.copy_object(Bucket=served, Key="copied", CopySource={"Bucket": served, "Key": "seg.log"})
    assert origin_s3.get_object(Bucket=served, Key="copied")["Body"].read() == served.encode()


def test_a_copy_names_one_source(
    sidecar: SidecarProcess, recorder: RecordingProxy, buckets: tuple[str, str]
) -> None:
    """Two signed x-amz-copy-source headers: only one would be checked, and an
    origin that takes the last copies from where it likes. (An SDK sends one;
    the request is signed here and sent with both.)"""
    served, other = buckets
    url = f"{sidecar.data_url}/{served}/two"
    request = AWSRequest(method="PUT", url=url)
    request.headers["x-amz-copy-source"] = f"/{served}/seg.log"
    request.headers["x-amz-copy-source"] = f"/{other}/seg.log"  # a second, kept
    S3SigV4Auth(Credentials(*OWN), "s3", "us-east-1").add_auth(request)
    host, _, port = sidecar.data_url.removeprefix("http://").rpartition(":")
    recorder.clear()
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.putrequest("PUT", f"/{served}/two", skip_host=True,
                              skip_accept_encoding=True)
        connection.putheader("Host", f"{host}:{port}")
        for name, value in request.headers.items():
            connection.putheader(name, value)
        connection.putheader("Content-Length", "0")
        connection.endheaders()
        response = connection.getresponse()
        status, body = response.status, response.read()
    finally:
        connection.close()
    assert status == 400 and b"<Code>InvalidArgument</Code>" in body, body
    assert b"x-amz-copy-source header may be sent once" in body
    assert recorder.requests == []


def test_scoped_keys(sidecar: SidecarProcess, buckets: tuple[str, str]) -> None:
    served, other = buckets
    reader = client(sidecar, (READER, READER_SECRET))
    assert reader.get_object(Bucket=served, Key="seg.log")["Body"].read() == served.encode()
    assert [o["Key"] for o in reader.list_objects_v2(Bucket=served, Prefix="seg")["Contents"]] \
        == ["seg.log"]
    assert "may only read" in denied(reader.put_object, Bucket=served, Key="r", Body=b"r")
    denied(reader.delete_object, Bucket=served, Key="seg.log")
    denied(reader.list_buckets)  # scoped to buckets: the identity's others stay unknown
    writer = client(sidecar, (WRITER, WRITER_SECRET))
    writer.put_object(Bucket=served, Key="w", Body=b"w")
    denied(writer.get_object, Bucket=other, Key="seg.log")


def test_anonymous_callers_read_the_served_bucket_and_never_list_buckets(
    sidecar: SidecarProcess, buckets: tuple[str, str]
) -> None:
    served, other = buckets
    assert unsigned(f"{sidecar.data_url}/{served}/seg.log") == (200, served.encode())
    status, body = unsigned(f"{sidecar.data_url}/")
    assert status == 403 and b"<Code>AccessDenied</Code>" in body, body
    status, body = unsigned(f"{sidecar.data_url}/{other}/seg.log")
    assert status == 403 and b"<Code>AccessDenied</Code>" in body, body
    status, body = unsigned(f"{sidecar.data_url}/{other}?list-type=2")
    assert status == 403 and b"<Code>AccessDenied</Code>" in body, body
    # S3 lets no unsigned GET override the answer's headers (a stored segment
    # served as text/html, inline, by anyone who reaches the port).
    status, body = unsigned(f"{sidecar.data_url}/{served}/seg.log"
                            "?response-content-type=text/html")
    assert status == 400 and b"<Code>InvalidRequest</Code>" in body, body
    # A sub-resource makes a bucket's HEAD that configuration's: no read.
    assert unsigned(f"{sidecar.data_url}/{served}?policy", "HEAD")[0] == 403
    assert unsigned(f"{sidecar.data_url}/{served}", "HEAD")[0] == 200


def test_the_plugins_operations_work_with_its_scoped_key(
    sidecar: SidecarProcess, buckets: tuple[str, str], origin_s3: Any
) -> None:
    # What Aiven's tiered-storage plugin does: multipart upload of a segment,
    # ranged GETs and HEADs, ListObjectsV2, DeleteObjects on retention.
    served, _ = buckets
    s3 = client(sidecar, (WRITER, WRITER_SECRET))
    key = "topic-x/0/00000000000000000000-seg.log"
    parts = [b"a" * (5 * 1024 * 1024), b"b" * 1000]
    upload = s3.create_multipart_upload(Bucket=served, Key=key)["UploadId"]
    etags = [s3.upload_part(Bucket=served, Key=key, UploadId=upload, PartNumber=n + 1,
                            Body=part)["ETag"] for n, part in enumerate(parts)]
    s3.complete_multipart_upload(
        Bucket=served, Key=key, UploadId=upload,
        MultipartUpload={"Parts": [{"ETag": e, "PartNumber": n + 1}
                                   for n, e in enumerate(etags)]})
    s3.put_object(Bucket=served, Key=key + ".index", Body=b"index")
    assert s3.head_object(Bucket=served, Key=key)["ContentLength"] == sum(map(len, parts))
    got = s3.get_object(Bucket=served, Key=key, Range="bytes=5242878-5242881")["Body"].read()
    assert got == b"aabb"
    listed = s3.list_objects_v2(Bucket=served, Prefix="topic-x/")["Contents"]
    assert [o["Key"] for o in listed] == [key, key + ".index"]
    s3.delete_objects(Bucket=served, Delete={"Objects": [{"Key": key}, {"Key": key + ".index"}]})
    assert "Contents" not in origin_s3.list_objects_v2(Bucket=served, Prefix="topic-x/")
