"""What a reloaded configuration changes, and what of it a running sidecar can
take without a restart: pure, on two trees.

Live (taken at once by SIGHUP or POST /api/v1/reload): the origin bandwidth and
the lanes' shares, admission (max_requests, client_timeout), the data port's
access keys, their scopes and the anonymous policy, the buckets and operations
it serves ([access]), the read-ahead window. Everything else (the
cache's geometry, addresses, threads, the origin endpoint...) is reported as
needing a restart and keeps its running value until then.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from sidecar.config.loading import window_blocks
from sidecar.config.options import OPTIONS
from sidecar.config.tree import Config

# Fields of the tree (section.field) a running sidecar applies at once.
LIVE_FIELDS = frozenset({
    "origin.bandwidth", "origin.prefetch_share", "origin.warm_share",
    "server.max_requests", "server.client_timeout_s",
    "auth.keys", "auth.allow_anonymous", "auth.scopes",
    "access.buckets", "access.bucket_admin", "access.copy_sources",
    "prefetch.max_window_bytes",
})
# Fields derived from a live option and from block_size, which only a restart
# changes: never compared (a block_size changed alone is no new window), but
# derived again for the running block_size.
_REDERIVED = frozenset({"prefetch.max_window_blocks"})
# Fields only the start reads, which say how an option was given, not what it
# is: memory_tier written out as "auto", its default, changes no tier.
_UNCOMPARED = frozenset({"cache.memory_tier_asked"})

# Fields filled from options of another name (sidecar.config.loading.derive).
_DERIVED_FROM = {
    "origin.prefetch_share": "prefetch_share",
    "origin.warm_share": "warm_share",
    "auth.keys": "auth_keys",
    "auth.allow_anonymous": "auth_allow_anonymous",
    "cache.directory": "cache_dir",
    "cache.max_coalesce_bytes": "max_coalesce",
    "cache.memory_tier_asked": "memory_tier",
    "prefetch.max_window_blocks": "prefetch_max_window",
    # Under cache_dir unless set: a new cache_dir moves it too.
    "server.admin_token_file": "admin_token_file",
}
_OPTION_OF_FIELD = {option.field: option.name for option in OPTIONS if option.field}


@dataclass(frozen=True)
class Reload:
    """``config``: the running tree with the live changes taken; ``applied`` and
    ``needs_restart``: the options that changed, by option name."""

    config: Config
    applied: tuple[str, ...]
    needs_restart: tuple[str, ...]


def option_of(path: str) -> str:
    """The option an operator writes for a field of the tree."""
    return _DERIVED_FROM.get(path) or _OPTION_OF_FIELD.get(path, path)


def plan_reload(running: Config, loaded: Config) -> Reload:
    applied: list[str] = []
    restart: list[str] = []
    sections: dict[str, Any] = {}
    for section in dataclasses.fields(running):
        old = getattr(running, section.name)
        new = getattr(loaded, section.name)
        taken: dict[str, Any] = {}
        for item in dataclasses.fields(old):
            path = f"{section.name}.{item.name}"
            if path in _REDERIVED or path in _UNCOMPARED \
                    or getattr(old, item.name) == getattr(new, item.name):
                continue
            if path in LIVE_FIELDS:
                taken[item.name] = getattr(new, item.name)
                applied.append(option_of(path))
            else:
                restart.append(option_of(path))
        sections[section.name] = dataclasses.replace(old, **taken) if taken else old
    prefetch = sections["prefetch"]
    blocks = window_blocks(prefetch.max_window_bytes, running.cache.block_size)
    if blocks != prefetch.max_window_blocks:
        sections["prefetch"] = dataclasses.replace(prefetch, max_window_blocks=blocks)
    return Reload(Config(**sections), tuple(dict.fromkeys(applied)),
                  tuple(dict.fromkeys(restart)))
