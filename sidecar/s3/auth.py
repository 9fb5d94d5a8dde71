"""Who may use the data port: the configured access keys and the anonymous policy.

The signature math is sidecar.s3.sigv4 (pure); this holds the secrets, the clock
and a small cache of derived signing keys (one HMAC chain per key, day and
region, instead of four HMACs per request).

Anonymous access (`auth_allow_anonymous`) next to configured keys is read-only:
everything the cache does not serve is passed through to the origin signed with
the sidecar's own credentials, so an unsigned PUT or DELETE would write with
them. With no keys at all (the loopback default) everything is served, as
before authentication existed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from sidecar.s3.operations import READ_OPERATIONS
from sidecar.s3.sigv4 import Credential, Verified, is_signed, signing_key, verify

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
    ) -> None:
        self._keys = dict(keys)
        self._allow_anonymous = allow_anonymous
        self._clock = clock
        self._derived: dict[tuple[str, str, str, str], bytes] = {}

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
        return verify(method, raw_path, headers, self._signing_key, self._clock())

    def anonymous_may(self, operation: str) -> bool:
        """Whether an anonymous request may perform `operation` (a sidecar.s3.operations name):
        anything with no keys configured, else only reads."""
        return not self._keys or operation in READ_OPERATIONS

    def _signing_key(self, credential: Credential) -> bytes | None:
        secret = self._keys.get(credential.access_key)
        if secret is None:
            return None
        scope = (credential.access_key, credential.date, credential.region, credential.service)
        key = self._derived.get(scope)
        if key is None:
            if len(self._derived) >= _MAX_CACHED_KEYS:
                self._derived.clear()
            key = self._derived[scope] = signing_key(
                secret, credential.date, credential.region, credential.service
            )
        return key

