"""Presigned paths for the benchmark clients: the sidecar serves only requests
signed with its origin credentials, as a broker's plugin signs them.

Each client signs an object's URL once (SigV4 in the query string, as S3's
presigned URLs are) and sends it on every request, with its Range header
unsigned: the signing costs the client nothing per request, and the sidecar
verifies every request as it would the plugin's. nginx and the origin emulator
ignore the query.
"""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from bench.sidecar_server import CREDENTIALS

# Long enough for any run (S3 allows up to seven days).
EXPIRES_S = 24 * 3600


def presigned_path(endpoint: str, bucket: str, key: str, method: str = "GET") -> str:
    """`/bucket/key?X-Amz-...` for a `method` (GET, HEAD) of the object through
    `endpoint` (whose host:port the signature covers)."""
    request = AWSRequest(method=method,
                         url=f"{endpoint.rstrip('/')}/{bucket}/{quote(key, safe='/~')}")
    S3SigV4QueryAuth(
        Credentials(CREDENTIALS["AWS_ACCESS_KEY_ID"], CREDENTIALS["AWS_SECRET_ACCESS_KEY"]),
        "s3", CREDENTIALS["AWS_DEFAULT_REGION"], expires=EXPIRES_S,
    ).add_auth(request)
    parts = urlsplit(request.url)
    return f"{parts.path}?{parts.query}"
