"""The data port's access policy (sidecar.s3.access) and its configuration:
pure, on names."""

from __future__ import annotations

import pytest

from sidecar.config import KeyScope, load_config
from sidecar.errors import ConfigError
from sidecar.s3.access import AccessPolicy, Caller, admin_header_of, source_bucket

OWN, ANONYMOUS = Caller("AKIDOWN"), Caller(None)
DIR = {"cache_dir": "/nonexistent/cache"}  # loading never touches it
POLICY = AccessPolicy(
    buckets=frozenset({"kafka-tiered"}), copy_sources=frozenset({"archive"}),
    scopes={"READER": KeyScope(("kafka-tiered",), write=False),
            "WRITER": KeyScope((), write=True)},
)


@pytest.mark.parametrize(
    ("caller", "operation", "bucket", "copy_source", "allowed"),
    [
        (OWN, "GetObject", "kafka-tiered", None, True),
        (OWN, "GetObject", "other", None, False),
        (OWN, "PutObject", "other", None, False),
        (OWN, "ListBuckets", "", None, True),
        (ANONYMOUS, "ListBuckets", "", None, False),
        (Caller("READER"), "ListBuckets", "", None, False),
        (Caller("WRITER"), "ListBuckets", "", None, True),
        (OWN, "CreateBucket", "kafka-tiered", None, False),
        (OWN, "DeleteBucket", "kafka-tiered", None, False),
        (OWN, "PutBucketConfig", "kafka-tiered", None, False),
        (OWN, "DeleteBucketConfig", "kafka-tiered", None, False),
        (OWN, "PutObjectAcl", "kafka-tiered", None, False),
        (OWN, "CopyObject", "kafka-tiered", "/kafka-tiered/a", True),
        (OWN, "CopyObject", "kafka-tiered", "archive/a%2Fb?versionId=1", True),
        (OWN, "UploadPartCopy", "kafka-tiered", "/other/a", False),
        (OWN, "CopyObject", "kafka-tiered", None, False),
        (Caller("READER"), "GetObject", "kafka-tiered", None, True),
        (Caller("READER"), "ListObjectsV2", "kafka-tiered", None, True),
        (Caller("READER"), "PutObject", "kafka-tiered", None, False),
        (Caller("READER"), "DeleteObjects", "kafka-tiered", None, False),
        (Caller("WRITER"), "DeleteObjects", "kafka-tiered", None, True),
        (ANONYMOUS, "GetObject", "other", None, False),
        (ANONYMOUS, "GetObject", "kafka-tiered", None, True),
    ],
)
def test_refusals(caller: Caller, operation: str, bucket: str, copy_source: str | None,
                  allowed: bool) -> None:
    assert (POLICY.refusal(caller, operation, bucket, copy_source) is None) is allowed


def test_no_served_buckets_serves_every_bucket_but_never_bucket_administration() -> None:
    policy = AccessPolicy()
    assert policy.refusal(OWN, "GetObject", "any-bucket") is None
    assert policy.refusal(OWN, "CopyObject", "a-bucket", "/b-bucket/k") is None
    assert policy.refusal(OWN, "CreateBucket", "any-bucket") is not None
    assert policy.refusal(ANONYMOUS, "ListBuckets", "") is not None
    admin = AccessPolicy(bucket_admin=True)
    assert admin.refusal(OWN, "PutBucketConfig", "any-bucket") is None


def test_headers_that_grant_or_bypass_retention_need_bucket_administration() -> None:
    assert admin_header_of([("Host", "h"), ("X-Amz-Acl", "public-read")]) == \
        "x-amz-acl: public-read"
    assert admin_header_of([("x-amz-acl", "authenticated-read")]) is not None
    assert admin_header_of([("x-amz-grant-full-control", "id=x")]) == "x-amz-grant-full-control"
    assert admin_header_of([("X-Amz-Bypass-Governance-Retention", "true")]) == \
        "x-amz-bypass-governance-retention"
    # An uploader's defaults give no one but the owners access.
    for canned in ("private", "bucket-owner-full-control", " Bucket-Owner-Read "):
        assert admin_header_of([("x-amz-acl", canned)]) is None
    assert admin_header_of([("x-amz-meta-acl", "public-read"), ("Range", "bytes=0-")]) is None
    writer = Caller("WRITER")
    refusal = POLICY.refusal(writer, "PutObject", "kafka-tiered",
                             admin_header="x-amz-acl: public-read")
    assert refusal == ("Setting x-amz-acl: public-read is not allowed here "
                       "(access_bucket_admin is off).")
    assert POLICY.refusal(writer, "PutObject", "kafka-tiered") is None
    admin = AccessPolicy(bucket_admin=True)
    assert admin.refusal(OWN, "CopyObject", "b", "/b/k", admin_header="x-amz-grant-read") is None


def test_source_bucket() -> None:
    assert source_bucket("/b/k/e/y?versionId=3") == "b"
    assert source_bucket("b%2Dx/k") == "b-x"
    assert source_bucket("") == ""


def test_access_options_load_and_check_each_other() -> None:
    config = load_config(DIR, {
        "SIDECAR_ACCESS_BUCKETS": "kafka-tiered, archive",
        "SIDECAR_AUTH_KEYS": "AKID1:s1,AKID2:s2",
        "SIDECAR_AUTH_SCOPES": "AKID1=read:kafka-tiered;AKID2=read-write",
    }, {})
    assert config.access.buckets == ("kafka-tiered", "archive")
    assert config.access.bucket_admin is False and config.access.copy_sources == ()
    assert config.auth.scopes == {"AKID1": KeyScope(("kafka-tiered",), False),
                                  "AKID2": KeyScope((), True)}
    table = load_config(DIR, {}, {
        "auth": {"keys": {"AKID1": "s1"}, "scopes": {"AKID1": "read-write:kafka-tiered"}},
        "access": {"buckets": ["kafka-tiered"], "bucket_admin": True},
    })
    assert table.auth.scopes == {"AKID1": KeyScope(("kafka-tiered",), True)}
    assert table.access.bucket_admin is True
    assert load_config(DIR, {}, {}).access.buckets == ()


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SIDECAR_ACCESS_BUCKETS": "bad!bucket"}, "is not an S3 bucket name"),
        ({"SIDECAR_AUTH_SCOPES": "AKID1=read"}, "not among auth_keys"),
        ({"SIDECAR_AUTH_KEYS": "AKID1:s", "SIDECAR_AUTH_SCOPES": "AKID1=admin"},
         "must start with read or read-write"),
        ({"SIDECAR_AUTH_KEYS": "AKID1:s", "SIDECAR_AUTH_SCOPES": "AKID1"},
         "is not AKID=MODE"),
        ({"SIDECAR_AUTH_KEYS": "AKID1:s", "SIDECAR_ACCESS_BUCKETS": "kafka-tiered",
          "SIDECAR_AUTH_SCOPES": "AKID1=read:elsewhere"}, "not among access_buckets"),
    ],
)
def test_bad_access_options_are_clear_errors(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(DIR, env, {})
