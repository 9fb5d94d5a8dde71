"""The credentials the sidecar signs its origin requests with, as the data
port accepts them (sidecar.s3.auth): taken from the same chain botocore
resolves (environment, profile, web identity, instance role) and taken again
every minute, so temporary ones are renewed before they expire."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("sidecar.origin.client")  # the origin's log lines keep their name

# How often the credentials the data port accepts are taken again from the
# origin's (temporary ones are renewed minutes before they expire).
_OWN_KEY_REFRESH_S = 60.0


class OwnKey:
    def __init__(self) -> None:
        self._credentials: Any = None
        self._key: tuple[str, str] | None = None
        self._refresher: asyncio.Task[None] | None = None

    async def start(self, session: Any) -> None:
        """The credentials the client signs with, resolved by the same chain
        (environment, profile, web identity, instance role)."""
        self._credentials = await session.get_credentials()
        await self._refresh()
        self._refresher = asyncio.get_running_loop().create_task(self._keep_fresh())

    def current(self) -> tuple[str, str] | None:
        """The access key id and secret as they are now; None without credentials."""
        return self._key

    async def _refresh(self) -> None:
        if self._credentials is None:
            self._key = None
            return
        # Temporary credentials (a role, web identity) are renewed here as
        # they near their expiry, as they would be for the next origin call.
        frozen = await self._credentials.get_frozen_credentials()
        self._key = (frozen.access_key, frozen.secret_key) \
            if frozen.access_key and frozen.secret_key else None

    async def _keep_fresh(self) -> None:
        while True:
            await asyncio.sleep(_OWN_KEY_REFRESH_S)
            try:
                await self._refresh()
            except Exception as exc:  # the old key serves until a refresh succeeds
                log.warning("could not refresh the origin credentials: %s", exc)

    def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
