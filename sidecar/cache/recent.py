"""Chunks just read from the cache, kept verified in memory for the next reader.

Kafka's remote reader asks for ~1 MiB from a record batch boundary and drops
the connection, so each fetch of a partition starts inside the chunk the last
one ended in (and had pushed ahead into the socket). Without this memory every
chunk of a replay would be read from the slab and hashed about twice.

Entries are keyed by the copy of the block they belong to (its identity and
generation: a block written again is a new copy) and hold bytes that were
verified against the chunk's checksum when read, or, for a chunk a reader was
waiting for as it landed, a copy of the buffer its checksum was taken in. A slab read past the page
cache reads a reader's next chunks with the one it asked for; they wait here.
The total is bounded in bytes (`recent_chunks`), whatever the number of
readers.
"""

from __future__ import annotations

from typing import Any

from cachetools import LRUCache

from sidecar.cache.ident import BlockIdent

Key = tuple[BlockIdent, int, int]  # block, generation, chunk
Bytes = bytes | bytearray | memoryview


class RecentChunks:
    def __init__(self, max_bytes: int, chunk_size: int) -> None:
        # None: no room for even one chunk (recent_chunks = 0).
        self._entries: LRUCache[Key, tuple[Bytes, int]] | None = LRUCache(
            maxsize=max_bytes, getsizeof=_length) if max_bytes >= chunk_size else None

    def get(self, block: BlockIdent, generation: int, chunk: int) -> memoryview | None:
        """The whole chunk, if kept."""
        if self._entries is None:
            return None
        found = self._entries.get((block, generation, chunk))
        return None if found is None else memoryview(found[0])[:found[1]]

    def put(self, block: BlockIdent, generation: int, chunk: int, data: Bytes,
            length: int) -> None:
        """Keep the chunk's first `length` bytes of `data`, which must never change."""
        if self._entries is not None:
            self._entries[(block, generation, chunk)] = (data, length)

    def forget_object(self, bucket: str, key: str) -> None:
        if self._entries is None:
            return
        for entry in [entry for entry in self._entries
                      if (entry[0].bucket, entry[0].key) == (bucket, key)]:
            del self._entries[entry]

    @property
    def enabled(self) -> bool:
        return self._entries is not None


def _length(value: Any) -> int:
    return int(value[1])
