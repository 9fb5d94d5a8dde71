"""The TOML value types each option takes in the config file.

A parser that reads an env var must take text, and so would take `str()` of
any TOML value: `protect_path = 5` became the path "5", `prefetch = 1` a
boolean and `cache_size = 1.5` one byte. The file's values carry a type (TOML
1.0: string, integer, float, boolean, date-time, array, table), so each option
names the types it takes and a value of any other type is refused before it
is parsed, with the option, the type given and what it takes.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sidecar.config.parsing import (
    fraction,
    non_negative_int,
    optional_str,
    parse_admin_token,
    parse_auth_keys,
    parse_bool,
    parse_bucket_list,
    parse_cpu_list,
    parse_duration,
    parse_host_port,
    parse_ionice,
    parse_key_scopes,
    parse_layout_name,
    parse_log_format,
    parse_nice,
    parse_node_name,
    parse_optional_host_port,
    parse_optional_http_url,
    parse_path_list,
    parse_rate,
    parse_s3_location,
    parse_sample_interval,
    parse_size,
    parse_size_or_auto,
    parse_stop_timeout,
    positive_int,
    shown,
)
from sidecar.errors import ConfigError

# The names TOML 1.0 gives its types, for what tomllib returns (exact types:
# bool is an int to Python, and a datetime a date).
_TYPE_NAMES: dict[type, str] = {
    str: "a string", int: "an integer", float: "a float", bool: "a boolean",
    list: "an array", dict: "a table", datetime.datetime: "a date-time",
    datetime.date: "a date", datetime.time: "a time",
}


def type_name(value: object) -> str:
    return _TYPE_NAMES.get(type(value), f"a {type(value).__name__}")


@dataclass(frozen=True)
class TomlType:
    """The TOML types one option's value may have, and how an error says so."""

    types: tuple[type, ...]
    takes: str
    # The type of an array's items or a table's values, where the value may be one.
    items: type | None = None

    def check(self, value: object, *, secret: bool = False) -> None:
        """Raise ConfigError for a value of another type; a secret option's
        value is never quoted (a token given as a number is still a token)."""
        if type(value) not in self.types:
            raise ConfigError(f"takes {self.takes}, got {type_name(value)}"
                              + ("" if secret else f": {shown(value)}"))
        if self.items is None or not isinstance(value, (list, dict)):
            return
        for item in value.values() if isinstance(value, dict) else value:
            if type(item) is not self.items:
                raise ConfigError(f"takes {self.takes}, got {type_name(value)} holding "
                                  f"{type_name(item)}" + ("" if secret else f": {shown(item)}"))


TEXT = TomlType((str,), "a string")
WHOLE = TomlType((int,), "an integer")
NUMBER = TomlType((int, float), "a number")
BOOLEAN = TomlType((bool,), "true or false")
SIZE = TomlType((int, str), 'an integer of bytes or a string such as "64MiB"')
SIZE_OR_AUTO = TomlType((int, str), 'an integer of bytes or a string such as "64MiB" or "auto"')
RATE = TomlType((int, str), 'an integer of bytes a second or a string such as "100MiB/s"')
DURATION = TomlType((int, float, str), 'a number of seconds or a string such as "30s"')
CPUS = TomlType((int, str), 'a CPU number or a string such as "2-3" or "0,2,4-5"')
STRINGS = TomlType((list,), "an array of strings", items=str)
# The env var's spelling (`AKID:SECRET,...`, `AKID=MODE;...`) stays valid in the
# file too. A secret's type is checked by parse_auth_keys, which names an entry
# by its position only.
KEY_TABLE = TomlType((dict, str), "a table of strings (or AKID:... text)", items=str)
SECRET_TABLE = TomlType((dict, str), "a table of strings (or AKID:SECRET text)")

BY_PARSER: dict[Callable[[object], Any], TomlType] = {
    str: TEXT, optional_str: TEXT, parse_admin_token: TEXT, parse_node_name: TEXT,
    parse_host_port: TEXT,
    parse_optional_host_port: TEXT,
    parse_optional_http_url: TEXT, parse_ionice: TEXT, parse_layout_name: TEXT,
    parse_log_format: TEXT, parse_s3_location: TEXT,
    positive_int: WHOLE, non_negative_int: WHOLE, parse_nice: WHOLE,
    fraction: NUMBER,
    parse_bool: BOOLEAN,
    parse_size: SIZE, parse_size_or_auto: SIZE_OR_AUTO, parse_rate: RATE,
    parse_duration: DURATION, parse_sample_interval: DURATION, parse_stop_timeout: DURATION,
    parse_cpu_list: CPUS,
    parse_path_list: STRINGS, parse_bucket_list: STRINGS,
    parse_auth_keys: SECRET_TABLE, parse_key_scopes: KEY_TABLE,
}


def toml_type(parse: Callable[[object], Any]) -> TomlType:
    """The TOML types an option with this parser takes (every parser of the
    option table has an entry: a unit test holds it)."""
    return BY_PARSER[parse]
