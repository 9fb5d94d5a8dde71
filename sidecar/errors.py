"""The sidecar's few error families.

Library errors (botocore, aiohttp, OS) are translated into these where they enter
the project (`raise ... from exc`), so the HTTP layer maps one small set of types
to S3 error responses and the CLI maps them to exit codes.
"""

from __future__ import annotations


class SidecarError(Exception):
    """Base of every error the sidecar raises on purpose."""


class ConfigError(SidecarError):
    """Bad flag, TOML key, env var, size or rate: the CLI prints it and exits 2."""


class MissingExtra(ConfigError):
    """A command whose extra is not installed (`pip install .`, what a broker node
    runs, installs none). The package is installed from its checkout, not an index."""

    def __init__(self, command: str, extra: str, module: str | None) -> None:
        package = (module or "").partition(".")[0] or "a package of it"
        super().__init__(f"`{command}` needs the {extra} extra ({package} is not installed): "
                         f"in the sidecar's checkout, pip install '.[{extra}]'")


Headers = tuple[tuple[str, str], ...]


class OriginError(SidecarError):
    """The object store failed to answer usefully (after retries).

    `headers`: the headers of the origin's error answer that S3 defines for it
    and that the client must see on the sidecar's answer too (a delete marker's
    `x-amz-delete-marker` and `x-amz-version-id`), as chosen where the origin's
    answer is translated (sidecar.origin.client.error_headers).
    """

    def __init__(self, message: str = "", *, headers: Headers = ()) -> None:
        super().__init__(message)
        self.headers = headers


class OriginUnavailable(OriginError):
    """Connection refused, timeout, 5xx after retries: the client gets 503."""


class ObjectNotFound(OriginError):
    """The origin answered 404 for the key."""


class BucketNotFound(OriginError):
    """The origin answered 404 for the bucket itself."""


class OriginAccessDenied(OriginError):
    """The origin answered 403."""


class OriginRequestRefused(OriginError):
    """The origin client would not send the request (a bucket name it cannot
    carry): the caller's input, not the origin's failure, so never retried
    and never counted by the circuit breaker."""


class DownloadsPaused(SidecarError):
    """cache-only mode: a miss would need the origin, and downloads are paused.

    `mode`: the mode that paused them (`cache-only`, or `bypass` for a warm-up),
    for answers that name it apart from the message (the warm API's 503)."""

    def __init__(self, message: str, mode: str | None = None) -> None:
        super().__init__(message)
        self.mode = mode


class FetchStopped(ConnectionAbortedError):
    """A block's fetch was stopped (the engine closing, as the sidecar stops)
    before the block landed: what its readers are told, neither the origin's
    failure nor their client's. A ConnectionAbortedError, as such a reader
    was told before this type said why."""


class Overloaded(SidecarError):
    """Admission control: too many requests or buffered bytes; the client gets SlowDown."""


class OriginObjectChanged(OriginError):
    """The origin's ETag no longer matches what a read was planned against (412)."""


class OriginThrottled(OriginUnavailable):
    """The origin kept answering SlowDown (or 429) until the deadline: the client gets SlowDown."""


class OriginCircuitOpen(OriginUnavailable):
    """The circuit breaker is open: a miss fails at once instead of hammering the origin."""


class OriginBadBody(OriginUnavailable):
    """A body shorter or longer than the range asked, or of another range: never cached."""


class OriginMalformedAnswer(OriginUnavailable):
    """An answer without what the request needs (a HEAD without the object's
    size): tried again like a broken body, never remembered."""
