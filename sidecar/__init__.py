"""Read-acceleration cache sidecar for the cold segments of Kafka tiered storage."""

from __future__ import annotations

import importlib.metadata


def installed_version() -> str:
    """The installed package's version (`sidecar --version`, sidecar_build_info)."""
    try:
        return importlib.metadata.version("kafka-cold-sidecar")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree
        return "unknown (not installed)"
