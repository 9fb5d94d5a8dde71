"""Which bucket names the sidecar takes: S3's, the legacy ones included.

S3 has named buckets by two sets of rules (Amazon S3 User Guide, "General
purpose bucket naming rules"): today's, 3-63 lower-case letters, digits, dots
and hyphens; and the legacy rules of us-east-1, under which buckets created
before March 1, 2018 may be up to 255 characters long and hold upper-case
letters and underscores. Such buckets still exist, path-style addressing (the
sidecar's) reaches them, and a tiered-storage plugin may be configured with
one: the sidecar refuses only what no S3 bucket can be named.

Two adjacent dots are refused as today's rules refuse them: a path segment of
dots is rewritten by URL normalisation in clients and proxies.

The cache records a bucket name in at most MAX_CACHED_BUCKET_CHARS bytes (the
slot header, sidecar.cache.slot_format): a longer legacy name is served by the
requests that pass through, and refused by name on a cached read.
"""

from __future__ import annotations

import re

MAX_BUCKET_CHARS = 255
MAX_CACHED_BUCKET_CHARS = 63
_LEGACY_NAME = re.compile(r"[A-Za-z0-9._-]{3,255}")
RULES = "3-255 letters, digits, '.', '-' and '_'"


def bucket_name_problem(name: str) -> str | None:
    """Why no S3 bucket can be named `name` (a short phrase); None when one can."""
    if not _LEGACY_NAME.fullmatch(name):
        return f"not an S3 bucket name ({RULES})"
    if ".." in name:
        return "not an S3 bucket name (two dots in a row)"
    return None


def uncached_bucket_problem(name: str) -> str | None:
    """Why the cache cannot hold objects of bucket `name` (a valid name); None
    when it can."""
    if len(name) > MAX_CACHED_BUCKET_CHARS:
        return (f"a bucket name of {len(name)} characters: the cache holds objects of "
                f"buckets named in at most {MAX_CACHED_BUCKET_CHARS}")
    return None
