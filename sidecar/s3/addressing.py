"""Where a data-port request points: bucket, key and query of a path-style URL.

S3's path-style addressing (`/{bucket}/{key}`), its bucket naming rules and key
limits (S3 User Guide, "Bucket naming rules" and "Naming Amazon S3 objects").
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from sidecar.bucket_names import bucket_name_problem
from sidecar.s3.errors import S3Error

MAX_KEY_BYTES = 1024  # S3's limit on object key length
# Characters XML 1.0 cannot carry (and so no S3 listing could return).
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f]")


def split_path(raw_path: str) -> tuple[str, str, dict[str, str]]:
    """`/bucket/some/key?x-id=GetObject` -> (bucket, key, query), percent-decoded.

    The raw path is used (not a normalised one) so that a key is exactly what the
    client signed; keys never become file paths here.
    """
    path, _, query = raw_path.partition("?")
    bucket, _, key = path.lstrip("/").partition("/")
    try:
        return (
            unquote(bucket, errors="strict"),
            unquote(key, errors="strict"),
            dict(query_pairs(query)),
        )
    except UnicodeDecodeError:
        raise S3Error(400, "InvalidURI", "Couldn't parse the specified URI.") from None


def query_pairs(raw_query: str) -> list[tuple[str, str]]:
    """The query's (name, value) pairs in order, percent-decoded as SigV4 reads
    them: a '+' is a plus sign, not a space (form decoding, as parse_qsl does,
    would have the origin see another query than the one signed), and bytes
    that are not UTF-8 survive as surrogates (quote(..., errors="surrogateescape")
    gives them back)."""
    pairs: list[tuple[str, str]] = []
    for item in raw_query.split("&"):
        if not item:
            continue
        name, _, value = item.partition("=")
        pairs.append((unquote(name, errors="surrogateescape"),
                      unquote(value, errors="surrogateescape")))
    return pairs


def validate_object_address(bucket: str, key: str) -> None:
    # S3's rules, the legacy ones of us-east-1 (upper case, '_') included:
    # buckets named by them exist and are addressed path-style.
    if bucket_name_problem(bucket) is not None:
        raise S3Error(400, "InvalidBucketName", "The specified bucket is not valid.")
    if len(key.encode("utf-8")) > MAX_KEY_BYTES:
        raise S3Error(400, "KeyTooLongError", "Your key is too long.")
    if _CONTROL_RE.search(key):
        raise S3Error(400, "InvalidArgument", "Object key contains control characters.")
    # Dot segments are rewritten by URL normalisation in clients and proxies, so
    # a key holding them cannot be addressed reliably; Kafka never writes them.
    if any(segment in (".", "..") for segment in key.split("/")):
        raise S3Error(400, "InvalidArgument", "Object key contains a '.' or '..' segment.")
