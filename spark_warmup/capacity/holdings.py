"""What a replay keeps beside the store's policy: the objects the trace knows,
and the slots the policy may not take as victims. Pure."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import UTC, datetime

from sidecar.cache.ident import BlockIdent
from sidecar.model import ObjectInfo

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Catalogue:
    """The objects the trace knows (bucket, key) -> (etag, size): for read-ahead
    into a partition's next segment, and the length of any block."""

    def __init__(self, block_size: int, keys: Iterable[tuple[str, str, str, int]]) -> None:
        self._block_size = block_size
        self._objects: dict[tuple[str, str], tuple[str, int]] = {}
        self._keys: dict[str, list[str]] = {}
        for bucket, key, etag, size in keys:
            self.know(bucket, key, etag, size)

    def know(self, bucket: str, key: str, etag: str, size: int) -> None:
        if (bucket, key) not in self._objects:
            self._keys.setdefault(bucket, []).append(key)
        self._objects[(bucket, key)] = (etag, size)

    def under(self, bucket: str, prefix: str) -> list[str]:
        return [key for key in self._keys.get(bucket, ()) if key.startswith(prefix)]

    def info(self, bucket: str, key: str) -> ObjectInfo:
        etag, size = self._objects[(bucket, key)]
        return ObjectInfo(bucket, key, size, etag, _EPOCH)

    def length(self, ident: BlockIdent) -> int:
        _, size = self._objects[(ident.bucket, ident.key)]
        start = ident.block * self._block_size
        return max(0, min(size, start + self._block_size) - start)


class Held:
    """Slots the policy may not take as victims: pinned by the reads reading them
    now (the engine's _attach), warmed blocks protected until read, within a
    share of the slots (the store's Residency.protect; the TTL is not in the
    log), and read-ahead held for its reader until a given time (`clock`: the
    replay's)."""

    def __init__(self, max_protected: int, clock: Callable[[], float] = lambda: 0.0) -> None:
        self._pins: dict[int, int] = {}  # slot -> reads reading it now
        self._protected: set[int] = set()
        self._max_protected = max_protected
        self._awaited: dict[int, float] = {}  # slot -> until when
        self._clock = clock

    def __call__(self, slot: int) -> bool:
        if slot in self._pins or slot in self._protected:
            return True
        until = self._awaited.get(slot)
        return until is not None and until > self._clock()

    def await_reader(self, slot: int, until: float) -> None:
        """Read-ahead landed before its reader came: no victim until `until`."""
        self._awaited[slot] = until

    def pin(self, slot: int) -> None:
        self._pins[slot] = self._pins.get(slot, 0) + 1

    def unpin(self, slot: int) -> None:
        if slot in self._pins:
            self._pins[slot] -= 1
            if not self._pins[slot]:
                del self._pins[slot]

    def protect(self, slot: int) -> None:
        if len(self._protected) < self._max_protected:
            self._protected.add(slot)

    def release(self, slot: int) -> None:
        """Read, or gone: no longer protected, nor awaited."""
        self._protected.discard(slot)
        self._awaited.pop(slot, None)
