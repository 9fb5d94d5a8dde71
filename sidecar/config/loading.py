"""Loading the configuration: the three sources merged, each value parsed once,
the tree built from the option table, derived values and cross-checks.

    resolve      flags > env > file > default, each option's value parsed once
                 (the keys file is read here, with the other sources)
    build_config fill every field an option names (generically), derive the
                 rest (`derive`), check the whole (`validate`), freeze
"""

from __future__ import annotations

import difflib
import tomllib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sidecar.blocks import MAX_BLOCK_SIZE, MIN_BLOCK_SIZE
from sidecar.config.bandwidth import bandwidth_refusal
from sidecar.config.options import BY_NAME, OPTIONS, Option
from sidecar.config.parsing import HostPort, parse_auth_keys_file
from sidecar.config.tree import (
    AccessConfig,
    AuthConfig,
    CacheConfig,
    Config,
    OriginConfig,
    PrefetchConfig,
    ServerConfig,
    chunk_bytes,
)
from sidecar.errors import ConfigError

SECTIONS: dict[str, type] = {
    "server": ServerConfig, "origin": OriginConfig, "cache": CacheConfig,
    "prefetch": PrefetchConfig, "auth": AuthConfig, "access": AccessConfig,
}
# The option whose raw value is a file to read while loading (its keys join
# auth_keys): read with the other sources, never while building the tree.
KEYS_FILE = "auth_keys_file"
# The admin token's file under the cache dir when admin_token_file is not set
# (sidecar.admin.token generates and reads it).
TOKEN_FILE_NAME = "admin.token"


def read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from None
    try:
        # TOML is UTF-8 (TOML 1.0, "Spec"); a byte-order mark some editors add
        # says nothing more, so it is let go.
        text = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 (byte {exc.start}); "
                          "TOML files are") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from exc
    except RecursionError:
        # tomllib parses nested arrays and inline tables by recursion: a few
        # thousand levels exhaust the stack, which no real config comes near.
        raise ConfigError(f"cannot read config file {path}: nested too deeply") from None


def flatten_sections(file_values: Mapping[str, Any]) -> dict[str, Any]:
    """TOML tables name groups of options: `[auth] keys = ...` is the option `auth_keys`.

    Only a table whose name starts known options is read this way, so a table
    that is itself one option's value (a mapping) is left alone.
    """
    flat: dict[str, Any] = {}
    for name, value in file_values.items():
        if _group_table(name, value):
            for inner, inner_value in value.items():
                _put_once(flat, f"{name}_{inner}", inner_value, f"{inner} in [{name}]")
        else:
            _put_once(flat, name, value, name)
    return flat


def _group_table(name: str, value: Any) -> bool:
    """Whether a table names a group of options. A name that is an option
    itself (`prefetch`, a boolean, beside `prefetch_max_window`) is a group
    when every key of the table names an option under it; a table-valued
    option (`[auth] keys`, access key -> secret) is not."""
    if not isinstance(value, dict) or not any(option.startswith(name + "_")
                                             for option in BY_NAME):
        return False
    if name not in BY_NAME:
        return True
    return bool(value) and all(f"{name}_{inner}" in BY_NAME for inner in value)


def _put_once(flat: dict[str, Any], key: str, value: Any, written: str) -> None:
    # `cache_size` beside `[cache] size`: one of them would silently lose.
    if key in flat:
        raise ConfigError(f"{key} is given twice in the config file (once as {written})")
    flat[key] = value


@dataclass(frozen=True)
class Setting:
    """One option's effective value: as given (`raw`), as parsed, and where it came from."""

    option: Option
    raw: object = field(repr=False)
    value: Any = field(repr=False)
    source: str  # "flag", "env", "file" or "default"


def unknown_key(name: str) -> str:
    """The error for a key no option has: the nearest option's name when the key
    looks like a typo of it, else where every key is listed."""
    near = difflib.get_close_matches(name, BY_NAME, n=1, cutoff=0.75)
    if near:
        return f"unknown config key {name!r}; did you mean {near[0]!r}?"
    return f"unknown config key {name!r} (every key is listed in docs/CONFIG.md)"


def resolve(
    flags: Mapping[str, object], env: Mapping[str, str], file_values: Mapping[str, Any],
    file_name: str | None = None,
) -> dict[str, Setting]:
    """Merge the three sources (flag > env > file > default) and parse each option once.

    `flags` holds only the flags that were given, keyed by option name; `file_name`,
    the config file's, names it in an error about one of its keys (SIDECAR_CONFIG
    may have chosen it out of the operator's sight).
    """
    in_file = f"{file_name}: " if file_name else ""
    file_values = flatten_sections(file_values)
    unknown = sorted(set(file_values) - set(BY_NAME))
    if unknown:
        raise ConfigError(in_file + unknown_key(unknown[0]))
    settings: dict[str, Setting] = {}
    for option in OPTIONS:
        if option.name in flags:
            raw, source, where = flags[option.name], "flag", option.cli
        elif option.env in env:
            raw, source, where = env[option.env], "env", option.env
        elif option.name in file_values:
            raw, source, where = (file_values[option.name], "file",
                                  f"{in_file}config key {option.name}")
        else:
            raw, source, where = option.default, "default", f"default of {option.name}"
        try:
            if source == "file":
                # Before parsing: a parser that takes env text takes str() of anything.
                option.file_type.check(raw, secret=option.secret)
            settings[option.name] = Setting(option, raw, option.parse(raw), source)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return _with_keys_file(settings)


def _with_keys_file(settings: dict[str, Setting]) -> dict[str, Setting]:
    """auth_keys with the keys of auth_keys_file added (a secret differing between
    the two for one access key id is an error)."""
    path = settings[KEYS_FILE].value
    if path is None:
        return settings
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise ConfigError(f"auth_keys_file: cannot read {path}: {reason}") from None
    keys: dict[str, str] = dict(settings["auth_keys"].value)
    for akid, secret in parse_auth_keys_file(text, Path(path)).items():
        if keys.get(akid, secret) != secret:
            raise ConfigError(
                "auth_keys and auth_keys_file give different secrets for one access key id"
            )
        keys[akid] = secret
    merged = settings["auth_keys"]
    return {**settings, "auth_keys": Setting(merged.option, merged.raw, keys, merged.source)}



def emptied_keys_file(before: Mapping[str, Setting], after: Mapping[str, Setting]) -> str | None:
    """The auth_keys_file that gave keys when `before` was read and gives none in
    `after` (most likely caught between the truncation and the writing of an
    in-place rewrite), or None. Taken, it would leave the brokers' keys out:
    403 for every request they sign."""
    path = after[KEYS_FILE].value
    if path is None or path != before[KEYS_FILE].value:
        return None
    return str(path) if _keys_from_file(before) and not _keys_from_file(after) else None


def _keys_from_file(settings: Mapping[str, Setting]) -> int:
    """How many keys auth_keys_file added to auth_keys."""
    merged = settings["auth_keys"]
    return len(merged.value) - len(merged.option.parse(merged.raw))


def load_config(
    flags: Mapping[str, object], env: Mapping[str, str], file_values: Mapping[str, Any]
) -> Config:
    """Merge the three sources (see `resolve`) and build the tree."""
    return build_config(resolve(flags, env, file_values))


def build_config(settings: Mapping[str, Setting]) -> Config:
    """The frozen tree from resolved settings: each option fills the field it
    names, `derive` fills the rest, `validate` checks the whole."""
    values: dict[str, Any] = {name: setting.value for name, setting in settings.items()}
    validate(values)
    sections: dict[str, dict[str, Any]] = {section: {} for section in SECTIONS}
    for option in OPTIONS:
        if option.field:
            section, attribute = option.field.split(".")
            sections[section][attribute] = values[option.name]
    given = frozenset(name for name, setting in settings.items() if setting.source != "default")
    for section, derived in derive(values, given).items():
        sections[section].update(derived)
    built = {name: SECTIONS[name](**sections[name]) for name in SECTIONS}
    return Config(**built)


def derive(values: Mapping[str, Any], given: Collection[str] = ()) -> dict[str, dict[str, Any]]:
    """The fields no single option fills, from the options that feed them
    (``given``: the options set by a flag, the environment or the file)."""
    block_size: int = values["block_size"]
    return {
        "cache": {
            "directory": Path(values["cache_dir"]),
            "memory_tier_asked": "memory_tier" in given,
            "max_coalesce_bytes": coalesce_bytes(values["max_coalesce"], block_size),
        },
        "prefetch": {
            "max_window_blocks": window_blocks(values["prefetch_max_window"], block_size),
        },
        "server": {
            # Beside the cache: the one directory a sidecar surely owns and writes.
            "admin_token_file": Path(values["admin_token_file"]
                                     or Path(values["cache_dir"]) / TOKEN_FILE_NAME),
        },
        "origin": {
            "prefetch_share": values["prefetch_share"],
            "warm_share": values["warm_share"],
        },
        "auth": {
            "keys": values["auth_keys"],
            # Besides these, the sidecar's own origin credentials sign (s3/auth.py).
            "allow_anonymous": bool(values["auth_allow_anonymous"]),
        },
    }


def window_blocks(max_window: int, block_size: int) -> int:
    """prefetch_max_window as the sidecar applies it: whole blocks, at least one."""
    return max(1, max_window // block_size)


def coalesce_bytes(max_coalesce: int, block_size: int) -> int:
    """max_coalesce as the sidecar applies it: whole blocks, at least one."""
    return max(block_size, max_coalesce - max_coalesce % block_size)


def block_size_refused(block_size: int) -> bool:
    """Whether the sidecar refuses this block size (BLOCK_SIZE_RULE)."""
    return not MIN_BLOCK_SIZE <= block_size <= MAX_BLOCK_SIZE or block_size % 4096 != 0


BLOCK_SIZE_RULE = "must be a multiple of 4KiB between 64KiB and 256MiB"


def validate(values: Mapping[str, Any]) -> None:
    """The checks that take more than one option, with what to change."""
    block_size: int = values["block_size"]
    if block_size_refused(block_size):
        raise ConfigError(f"--block-size {BLOCK_SIZE_RULE}, got {block_size}")
    for option in OPTIONS:
        if option.required and values[option.name] is None:
            raise ConfigError(f"{option.cli} is required: the {option.help}")
    if values["cache_size"] < block_size + 4096:
        raise ConfigError(
            f"--cache-size {values['cache_size']} cannot hold one block of {block_size} bytes"
        )
    chunk = chunk_bytes(block_size)
    if values["memory_tier"] and values["memory_tier"] < chunk:
        raise ConfigError(
            f"memory_tier {values['memory_tier']} cannot hold one chunk of {chunk} bytes: "
            "give it at least that, or 0 to turn it off"
        )
    # Foreground keeps connections of its own: a miss never waits for one that
    # read-ahead or warm-up holds.
    lower_lanes = values["prefetch_max_in_flight"] + values["warm_concurrency"]
    if lower_lanes > values["origin_max_connections"] - 4:
        raise ConfigError(
            f"prefetch_max_in_flight + warm_concurrency ({lower_lanes}) must leave at least 4 "
            f"of origin_max_connections ({values['origin_max_connections']}) to foreground reads"
        )
    for name in ("passthrough_acquire_timeout", "passthrough_timeout"):
        if values[name] <= 0:
            raise ConfigError(f"{name} must be more than 0 (every pass-through would fail)")
    for name in ("prefetch_share", "warm_share"):
        if values[name] == 0:
            # A lane with no share could never read: its fetches would wait forever.
            raise ConfigError(f"{name} must be more than 0 (its lane would never read from "
                              "the origin); give it a small share such as 0.05")
    refusal = bandwidth_refusal(values["origin_bandwidth"], values["prefetch_share"],
                                values["warm_share"], block_size)
    if refusal is not None:
        raise ConfigError(refusal)
    if values["origin_deadline"] <= 0:
        raise ConfigError("origin_deadline must be more than 0 (every origin read would fail)")
    if values["access_log_upload"] is not None and (
            values["access_log"] in (None, "-") or not values["access_log_max_size"]
            or not values["access_log_backups"]):
        # Only a rotated file is shipped: the log must be a file that rotates into
        # PATH.1, where the shipper finds it.
        raise ConfigError(
            "access_log_upload ships rotated access log files: it needs access_log set to a "
            "file path (not -), access_log_max_size above 0 and access_log_backups of 1 or more")
    admin: HostPort = values["admin_listen"]
    if not admin.is_loopback and values["admin_token"] is None \
            and values["admin_token_file"] is None:
        # Named in every form: the listen address may have come from a file or the env.
        # A token generated into the default file would be one nobody off the node
        # knows of: off loopback the operator chooses where the token comes from.
        raise ConfigError(
            f"admin_listen {admin} is not loopback: set admin_token (--admin-token, "
            "SIDECAR_ADMIN_TOKEN or admin_token in the config file) or admin_token_file "
            "to protect the admin port"
        )
    _validate_access(values)


def _validate_access(values: Mapping[str, Any]) -> None:
    """Key scopes name configured keys, within the served buckets."""
    served = set(values["access_buckets"])
    for akid, scope in values["auth_scopes"].items():
        if akid not in values["auth_keys"]:
            raise ConfigError(f"auth_scopes names {akid}, which is not among auth_keys "
                              "(nor in auth_keys_file)")
        outside = sorted(set(scope.buckets) - served) if served else []
        if outside:
            raise ConfigError(f"auth_scopes gives {akid} bucket {outside[0]}, which is not "
                              "among access_buckets")


def tree_fields() -> dict[str, set[str]]:
    """Every field of the tree, by section (the option table's completeness test)."""
    return {name: {f.name for f in fields(section)} for name, section in SECTIONS.items()}
