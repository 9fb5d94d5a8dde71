"""The origin as the engine needs it: handed in (sidecar.origin's client, or a
fake in tests), so the engine's rooms depend on this contract, not on the
client."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from typing import Protocol

from sidecar.model import ObjectInfo

Sink = Callable[[int, memoryview], None]
"""Takes one chunk of a fetch in a worker thread: (object offset, bytes)."""


class OriginReader(Protocol):
    """The origin as the engine needs it (handed in; tests give a fake)."""

    async def fetch_into(
        self, info: ObjectInfo, start: int, end: int, lane: str, sink: Sink, chunk_size: int,
        *, waited_for: bool = False,
    ) -> None:
        """Bytes [start, end) of the object to `sink`, in chunks of `chunk_size`
        aligned in object offsets, called in worker threads; retried, resumed
        and bounded by the origin's own rules. `waited_for`: a reader waits on
        these bytes now (they go before other work for the origin)."""

    def read_range(
        self, info: ObjectInfo, start: int, end: int, lane: str
    ) -> AsyncGenerator[bytes, None]:
        """Bytes [start, end) as they arrive (what bypasses the cache)."""

    async def head(self, bucket: str, key: str) -> ObjectInfo: ...

    async def list_keys(self, bucket: str, prefix: str, start_after: str = "") -> list[str]:
        """Keys under `prefix`; with `start_after`, those after it (at least
        the first 1,000 of them)."""
