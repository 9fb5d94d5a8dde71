"""The cache disk's failures, counted: in the metrics, and towards bypass.

A read the disk fails (EIO) or that comes back short or wrong is a checksum
failure of its block; past the limits of ``sidecar.cache.faults`` the disk
counts as failing its reads. A write the disk refuses is described for the
caller, which decides whether to keep using the cache.
"""

from __future__ import annotations

import errno
from collections.abc import Callable

from sidecar.cache.errors import ChecksumMismatch
from sidecar.cache.faults import ReadFaults
from sidecar.cache.outcomes import CacheMetrics


class DiskFaults:
    def __init__(self, metrics: CacheMetrics, clock: Callable[[], float]) -> None:
        self._metrics = metrics
        self._clock = clock
        self._reads = ReadFaults()

    def checksum_failed(self, exc: ChecksumMismatch | OSError) -> None:
        """A read of cached bytes failed or did not match its checksum."""
        self._metrics.on_checksum_failure()
        self.read_failed(exc)

    def read_failed(self, exc: ChecksumMismatch | OSError) -> None:
        if isinstance(exc, OSError):
            self._metrics.on_disk_error("read")
            self._reads.error(self._clock(), exc)
        else:
            self._reads.mismatch(self._clock())

    def write_failed(self, exc: OSError) -> str:
        """Count a write the disk refused; what went wrong, for the caller."""
        self._metrics.on_disk_error("write")
        return describe_disk_error(exc)

    def read_fault(self) -> str | None:
        """Why the disk counts as failing its reads, or None."""
        return self._reads.problem(self._clock())

    def disk_recovered(self) -> None:
        """The disk was seen well again: earlier failed reads no longer count."""
        self._reads.clear()


def describe_disk_error(exc: OSError) -> str:
    return f"{errno.errorcode.get(exc.errno or 0, 'error')}: {exc.strerror or exc}"
