"""Who may use the data port: the configured access keys and the anonymous policy.

The signature math is sidecar.sigv4 (pure); this holds the secrets, the clock
and a small cache of derived signing keys (one HMAC chain per key, day and
region, instead of four HMACs per request).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from sidecar.sigv4 import Credential, is_signed, signing_key, verify

# Distinct (key, day, region) scopes remembered; a client naming ever new
# regions only costs re-deriving, never memory.
_MAX_CACHED_KEYS = 256


class Authenticator:
    """Checks data-port requests; raises sidecar.sigv4.SignatureRejected on refusal."""

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

    def check(self, method: str, raw_path: str, headers: Sequence[tuple[str, str]]) -> str | None:
        """The access key that signed the request, or None for an allowed anonymous one.

        A signed request is always verified, even where anonymous ones pass: a
        bad signature is a client bug or an attack, never "anonymous".
        """
        if self._allow_anonymous and not is_signed(raw_path, headers):
            return None
        return verify(method, raw_path, headers, self._signing_key, self._clock())

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
