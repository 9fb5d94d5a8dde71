"""What a data-port caller may do: the buckets the sidecar serves, the
operations it passes on, and each key's scope. Pure: no I/O.

Everything the cache does not serve reaches the origin signed with the
sidecar's own credentials, which may reach far more than the tiered-storage
plugin's bucket (an IAM identity shared with other jobs, an admin key in a
test rig). So before the origin is asked:

- a bucket the sidecar does not serve ([access] buckets) is 403 AccessDenied;
- bucket-level writes (CreateBucket, DeleteBucket, bucket configuration such as
  a policy, an ACL or a lifecycle) and object ACL writes are refused unless
  [access] bucket_admin: the plugin needs none of them. That includes an ACL
  set by headers on a write the plugin does make (x-amz-grant-*, and an
  x-amz-acl other than the owner-only canned ones that uploaders such as
  rclone send by default, on PutObject, CopyObject or CreateMultipartUpload:
  a copy of an object onto itself with them is PutObjectAcl by another name),
  and the bypass of object-lock governance retention
  (x-amz-bypass-governance-retention);
- a copy reads its source with the sidecar's credentials too: the source must
  be a served bucket or one of [access] copy_sources;
- a key scoped in [auth] scopes uses only its buckets, and only reads when its
  scope is `read`;
- an anonymous caller (auth_allow_anonymous) reads the served buckets only,
  and never lists the buckets the identity has.

With no [access] buckets every bucket is served (as before the section
existed); the other rules hold all the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote

from sidecar.config import AccessConfig, KeyScope
from sidecar.s3.operations import READ_OPERATIONS

# Bucket-level writes and ACL writes (sidecar.s3.operations names).
BUCKET_ADMIN_OPERATIONS = frozenset({
    "CreateBucket", "DeleteBucket", "PutBucketConfig", "DeleteBucketConfig", "PutObjectAcl",
})
COPY_OPERATIONS = frozenset({"CopyObject", "UploadPartCopy"})
# Headers that grant access to an object or override its retention: the
# rights of an ACL write (S3 API reference: PutObject, CopyObject,
# CreateMultipartUpload; DeleteObject for the bypass). Canned ACLs that give
# no one but the owners access are an uploader's defaults, not a grant.
_ACL = "x-amz-acl"
_OWNERS_ONLY_ACLS = frozenset({"private", "bucket-owner-full-control", "bucket-owner-read"})
_BYPASS = "x-amz-bypass-governance-retention"
_GRANT_PREFIX = "x-amz-grant-"
LIST_BUCKETS = "ListBuckets"


@dataclass(frozen=True)
class Caller:
    """Who sent a request: ``access_key`` None is an anonymous caller; the
    sidecar's own origin key and keys without a scope are unscoped."""

    access_key: str | None

    @property
    def anonymous(self) -> bool:
        return self.access_key is None


@dataclass(frozen=True)
class AccessPolicy:
    buckets: frozenset[str] = frozenset()  # empty: every bucket
    bucket_admin: bool = False
    copy_sources: frozenset[str] = frozenset()
    scopes: Mapping[str, KeyScope] = field(default_factory=dict)

    @classmethod
    def of(cls, access: AccessConfig, scopes: Mapping[str, KeyScope]) -> AccessPolicy:
        return cls(frozenset(access.buckets), access.bucket_admin,
                   frozenset(access.copy_sources), dict(scopes))

    def refusal(
        self, caller: Caller, operation: str, bucket: str, copy_source: str | None = None,
        admin_header: str | None = None,
    ) -> str | None:
        """Why ``caller`` may not perform ``operation`` on ``bucket`` (the message
        of a 403 AccessDenied), or None when it may. ``copy_source``: the
        x-amz-copy-source header of a copy, as sent; ``admin_header``: a header
        of the request that only bucket administration may send
        (``admin_header_of``)."""
        scope = None if caller.access_key is None else self.scopes.get(caller.access_key)
        if not bucket:
            if operation != LIST_BUCKETS or caller.anonymous or (scope and scope.buckets):
                return "Listing the buckets is not allowed here."
            return None
        if not self._serves(bucket):
            return f"This sidecar does not serve bucket {bucket}."
        if operation in BUCKET_ADMIN_OPERATIONS and not self.bucket_admin:
            return f"{operation} is not allowed here (access_bucket_admin is off)."
        if admin_header is not None and not self.bucket_admin:
            return f"Setting {admin_header} is not allowed here (access_bucket_admin is off)."
        if scope is not None:
            if scope.buckets and bucket not in scope.buckets:
                return f"This access key may not use bucket {bucket}."
            if not scope.write and operation not in READ_OPERATIONS:
                return "This access key may only read."
        if operation in COPY_OPERATIONS:
            return self._copy_refusal(scope, copy_source)
        return None

    def _serves(self, bucket: str) -> bool:
        return not self.buckets or bucket in self.buckets

    def _copy_refusal(self, scope: KeyScope | None, copy_source: str | None) -> str | None:
        source = source_bucket(copy_source or "")
        allowed = source in self.copy_sources or (
            self._serves(source) and (scope is None or not scope.buckets
                                      or source in scope.buckets))
        if not source or not allowed:
            return f"Copying from bucket {source or '(none)'} is not allowed here."
        return None


def admin_header_of(headers: Iterable[tuple[str, str]]) -> str | None:
    """The first of a request's headers that grants access or bypasses
    retention (its name, and a canned ACL's value), or None."""
    for name, value in headers:
        lowered = name.lower()
        if lowered == _ACL and value.strip().lower() not in _OWNERS_ONLY_ACLS:
            return f"{_ACL}: {value.strip()}"
        if lowered == _BYPASS or lowered.startswith(_GRANT_PREFIX):
            return lowered
    return None


def source_bucket(copy_source: str) -> str:
    """The bucket of an x-amz-copy-source value (`/bucket/key?versionId=v` or
    `bucket/key`, URL-encoded; CopyObject API reference)."""
    path = unquote(copy_source.partition("?")[0]).lstrip("/")
    return path.partition("/")[0]
