"""The block store's metrics sink (sidecar.cache.CacheMetrics), counting for tests."""

from __future__ import annotations

from collections import Counter


class RecordingMetrics:
    def __init__(self) -> None:
        self.evictions: Counter[str] = Counter()
        self.checksum_failures = 0
        self.disk_errors: Counter[str] = Counter()

    def on_eviction(self, reason: str) -> None:
        self.evictions[reason] += 1

    def on_checksum_failure(self) -> None:
        self.checksum_failures += 1

    def on_disk_error(self, op: str) -> None:
        self.disk_errors[op] += 1
