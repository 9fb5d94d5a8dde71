"""boto3 clients the functional tests open against moto or a sidecar, each closed
after the test that made it (tests/functional/conftest.py's autouse fixture calls
`close_clients`): unclosed pooled sockets would be reported against whichever
later test happens to run when they are garbage-collected."""

from __future__ import annotations

from typing import Any

from sidecar.tools.local_s3 import loopback_client

_open: list[Any] = []


def s3_client(endpoint: str, *, key: str | None = None, secret: str | None = None) -> Any:
    """A path-style client with one attempt, closed at the end of the test; signing
    with KEY and SECRET when given, else with the environment's credentials."""
    client = loopback_client(endpoint, key=key, secret=secret)
    _open.append(client)
    return client


def close_clients() -> None:
    while _open:
        _open.pop().close()
