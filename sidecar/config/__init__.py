"""The sidecar's configuration: one option table, loaded in one place into one
frozen tree (flags > env > file > defaults; each value parsed once, so
"unlimited", sizes and durations are normalised here and nowhere else).

    parsing.py   one option's value: sizes, rates, durations, addresses, keys
    options.py   the option table: parser, default, help, flag, the field it fills
    toml_types.py the TOML types each option takes in the config file
    tree.py      the frozen dataclasses the rest of the sidecar reads
    loading.py   the sources merged, the tree built, derived, validated
    reference.py docs/CONFIG.md and --check-config, rendered from the table

Importing this package needs the standard library only (and sidecar's pure
modules): `make config-docs` runs without the venv.
"""

from __future__ import annotations

from sidecar.config.loading import (
    Setting,
    build_config,
    flatten_sections,
    load_config,
    read_toml,
    resolve,
)
from sidecar.config.options import OPTIONS, Option
from sidecar.config.parsing import (
    HostPort,
    KeyScope,
    S3Location,
    parse_bool,
    parse_duration,
    parse_host_port,
    parse_rate,
    parse_size,
)
from sidecar.config.tree import (
    AccessConfig,
    AuthConfig,
    CacheConfig,
    Config,
    OriginConfig,
    PrefetchConfig,
    ServerConfig,
)

__all__ = [
    "OPTIONS", "AccessConfig", "AuthConfig", "CacheConfig", "Config", "HostPort", "KeyScope",
    "Option", "OriginConfig", "PrefetchConfig", "S3Location", "ServerConfig", "Setting",
    "build_config", "flatten_sections", "load_config", "parse_bool", "parse_duration",
    "parse_host_port", "parse_rate", "parse_size", "read_toml", "resolve",
]
