"""Who may use the data port: the configured access keys and the anonymous policy.

The signature math is sidecar.s3.sigv4 (pure); this holds the secrets, the clock,
a small cache of derived signing keys (one HMAC chain per key, day and
region, instead of four HMACs per request) and the presigned URLs verified
lately (a configuration reload makes a new Authenticator: none is carried over).

Secure by default: a request must be signed, with a configured key or with
the sidecar's own origin credentials (the tiered-storage plugin on the same
node usually has the same ones). Everything the cache does not serve is passed
through to the origin signed with those credentials, so an unsigned PUT or
DELETE that any local process could send would otherwise write with them (a
confused deputy able to erase a topic's history). Anonymous access
(`auth_allow_anonymous`) is opt-in and read-only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from sidecar.s3.operations import READ_OPERATIONS
from sidecar.s3.sigv4 import (
    Credential,
    PresignedMemo,
    Verified,
    is_signed,
    signing_key,
    verify,
)

# Distinct (key, day, region) scopes remembered; a client naming ever new
# regions only costs re-deriving, never memory.
_MAX_CACHED_KEYS = 256


class Authenticator:
    """Checks data-port requests; raises sidecar.s3.sigv4.SignatureRejected on refusal."""

    def __init__(
        self,
        keys: Mapping[str, str],
        allow_anonymous: bool,
        clock: Callable[[], float] = time.time,
        origin_key: Callable[[], tuple[str, str] | None] = lambda: None,
    ) -> None:
        """`origin_key`: the sidecar's own origin credentials as they are now
        (access key id, secret), or None; asked per request, since temporary
        credentials are replaced as they expire."""
        self._keys = dict(keys)
        self._allow_anonymous = allow_anonymous
        self._clock = clock
        self._origin_key = origin_key
        self._derived: dict[tuple[str, str, str, str, str], bytes] = {}
        self._presigned = PresignedMemo()

    def __repr__(self) -> str:
        return f"Authenticator(keys={len(self._keys)}, allow_anonymous={self._allow_anonymous})"

    def check(
        self, method: str, raw_path: str, headers: Sequence[tuple[str, str]]
    ) -> Verified | None:
        """Who signed the request (and its ChunkSigner), or None for an anonymous
        one that may go on (what it may do: anonymous_may).

        A signed request is always verified, even where anonymous ones pass: a
        bad signature is a client bug or an attack, never "anonymous".
        """
        if self._allow_anonymous and not is_signed(raw_path, headers):
            return None
        return verify(method, raw_path, headers, self._signing_key, self._clock(),
                      self._presigned)

    @staticmethod
    def anonymous_may(operation: str) -> bool:
        """Whether an anonymous request may perform `operation` (a
        sidecar.s3.operations name): only reads."""
        return operation in READ_OPERATIONS

    def _signing_key(self, credential: Credential) -> bytes | None:
        secret = self._keys.get(credential.access_key)
        if secret is None:
            own = self._origin_key()
            if own is None or own[0] != credential.access_key:
                return None
            secret = own[1]
        # The secret is part of the scope: a key id whose secret was rotated
        # never verifies with the old one.
        scope = (credential.access_key, secret, credential.date, credential.region,
                 credential.service)
        key = self._derived.get(scope)
        if key is None:
            if len(self._derived) >= _MAX_CACHED_KEYS:
                self._derived.clear()
            key = self._derived[scope] = signing_key(
                secret, credential.date, credential.region, credential.service
            )
        return key

