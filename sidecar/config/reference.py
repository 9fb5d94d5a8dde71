"""How options are shown to operators: the reference page and the effective configuration.

Everything here is rendered from the OPTIONS table in `sidecar/config/options.py`, so the
documentation cannot drift from what `load_config` accepts:

    python -m sidecar.config.reference          > docs/CONFIG.md   (make config-docs)
    python -m sidecar.config.reference --toml   # a skeleton TOML file of every option

`sidecar serve --check-config` and the start-up log record show the effective
configuration with `render_effective` / `effective_values`; a secret option is
only ever shown as `<set>` or `<unset>`.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence

from sidecar.config import OPTIONS, Option, Setting
from sidecar.errors import ConfigError

# Flags that are not `--name VALUE`: cli.py builds these, the reference lists them.
NEGATED_FLAGS: Mapping[str, str] = {"prefetch": "--no-prefetch"}

# Options name their group with Option(group=...); the rest are placed by name.
# Order here is the order of the sections in docs/CONFIG.md.
GROUPS: tuple[tuple[str, str], ...] = (
    ("server", "Ports, logs and client limits"),
    ("origin", "Origin (the object store)"),
    ("cache", "Cache disk"),
    ("prefetch", "Read-ahead"),
    ("isolation", "Isolation from the broker"),
    ("auth", "Data-port authentication ([auth])"),
    ("access", "What the data port serves ([access])"),
    ("other", "Other"),
)
_GROUP_OF_NAME: Mapping[str, str] = {
    "listen": "server", "admin_listen": "server", "admin_token": "server",
    "access_log": "server", "log_format": "server", "max_requests": "server",
    "max_buffered": "server", "client_timeout": "server", "stats_interval": "server",
    "stop_timeout": "server",
    "head_ttl": "origin", "listing_ttl": "origin", "head_stale_if_error": "origin",
    "block_size": "cache", "max_coalesce": "cache", "io_threads": "cache",
    "protect_path": "cache", "allow_shared_disk": "cache", "preallocate": "cache",
    "drop_written_pages": "cache", "direct_io": "cache",
    "stream_idle": "prefetch", "layout": "prefetch", "layout_prefix": "prefetch",
    "cpus": "isolation", "ionice": "isolation", "nice": "isolation",
    "origin_bandwidth": "isolation", "prefetch_share": "isolation", "warm_share": "isolation",
    "warm_concurrency": "isolation",
}
_GROUP_OF_PREFIX: tuple[tuple[str, str], ...] = (
    ("auth_", "auth"), ("access_", "access"), ("origin_", "origin"), ("cache_", "cache"),
    ("disk_", "cache"),
    ("scrub", "cache"), ("prefetch", "prefetch"), ("log_", "server"), ("admin_", "server"),
)
_TITLES = dict(GROUPS)
# The access log's options start like [access]'s but are no part of it (what
# the data port serves): not shown as `[access] log = ...`, which is legal all
# the same.
_NOT_IN_TABLE = frozenset({"access_log", "access_log_max_size", "access_log_backups",
                           "access_log_upload"})

SECRET_SET = "<set>"
SECRET_UNSET = "<unset>"


def group_of(option: Option) -> str:
    """The option's section: its own `group`, else by name, else by prefix, else `other`."""
    if option.group:
        return option.group
    if option.name in _GROUP_OF_NAME:
        return _GROUP_OF_NAME[option.name]
    for prefix, group in _GROUP_OF_PREFIX:
        if option.name.startswith(prefix):
            return group
    return "other"


def grouped(options: Iterable[Option]) -> list[tuple[str, list[Option]]]:
    """(title, options) in GROUPS order; a group named only by Option(group=...) comes last."""
    sections: dict[str, list[Option]] = {key: [] for key, _ in GROUPS}
    for option in options:
        sections.setdefault(group_of(option), []).append(option)
    return [(_TITLES.get(key, key), members) for key, members in sections.items() if members]


def table_form(option: Option, names: Iterable[str]) -> tuple[str, str] | None:
    """(table, key) when `[table] key = ...` sets the option and the table is a section name.

    config.flatten_sections accepts any such prefix (`[max] requests` is
    `max_requests`); the reference shows only the tables named after a section
    (`[auth]`, `[origin]`, `[cache]`), which is how an operator would group them.
    """
    table, sep, key = option.name.partition("_")
    if not sep or table in set(names) or table not in _TITLES or option.name in _NOT_IN_TABLE:
        return None
    return table, key


def flag_of(option: Option) -> str | None:
    if option.name in NEGATED_FLAGS:
        return NEGATED_FLAGS[option.name]
    if not option.flag:
        return None
    if option.kind == "switch":
        return option.cli
    return f"{option.cli} {option.metavar}".rstrip()


def toml_literal(value: object) -> str:
    """A TOML value for a default or an effective value (TOML 1.0 inline syntax)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else json.dumps(str(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_literal(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{json.dumps(str(k))} = {toml_literal(v)}"
                               for k, v in value.items()) + "}"
    # A JSON string is a valid TOML basic string for everything a config holds.
    return json.dumps(str(value))


def default_text(option: Option) -> str:
    """The default as an operator reads it: `none` where the empty default means
    unset, `required` where there is none to fall back on."""
    if option.required:
        return "required"
    if option.default == "" and not isinstance(option.parse(option.default), str):
        return "none"
    return toml_literal(option.default)


def _value_text(option: Option) -> str:
    value = option.metavar or "BOOL"
    if option.kind == "switch":
        return f"{value} (the flag takes no value)"
    if option.kind == "list":
        return (f"{value}, repeatable flag; TOML list; env comma-separated")
    return value


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_markdown(options: Sequence[Option]) -> str:
    """docs/CONFIG.md: every option once, grouped, with its flag, env var and TOML key."""
    names = [option.name for option in options]
    lines = [
        "# Configuration reference",
        "",
        "<!-- Generated from OPTIONS in sidecar/config/options.py by `make config-docs`"
        " (python -m sidecar.config.reference). Do not edit by hand. -->",
        "",
        "Every option has one name used three ways: a TOML key in the file given by",
        "`--config FILE` (or env `SIDECAR_CONFIG`), an environment variable",
        "`SIDECAR_<NAME>`, and for the common ones a command-line flag of `sidecar serve`.",
        "Precedence is flag > env > file > default. Sizes accept `8MiB`, `10GiB`, `500MB`",
        "or plain bytes; rates the same with `/s` (or `unlimited`); durations `30s`,",
        "`500ms`, `2m`; booleans `true`/`false`. A key of the form `group_name` may also",
        "be written in a TOML table: `[auth]` with `keys = ...` is the option `auth_keys`.",
        "In the file a value has the TOML type its option takes: booleans unquoted,",
        "counts and fractions as numbers, sizes and rates as integers or strings,",
        "lists as arrays of strings (`protect_path = [\"/data/kafka\"]`). A value of",
        "another type is refused (exit 2), naming the option, the type given and the",
        "type it takes.",
        "",
        "`sidecar serve --check-config` loads and validates the configuration from all",
        "three sources exactly as `serve` does, prints the effective values (secrets",
        "as `<set>`/`<unset>`) and exits 0 (2 on a bad value) without binding ports,",
        "contacting the origin or touching the cache directory. An annotated example",
        "is `sidecar.example.toml` at the repository root.",
        "",
        "Environment only: `SIDECAR_LOG_LEVEL` (`DEBUG`, `INFO` (default), `WARNING`,",
        "`ERROR`) and `SIDECAR_CONFIG`. Origin credentials come from botocore's usual",
        "chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, profiles, instance roles).",
        "",
        "Options marked **secret** are never printed: not in logs, errors, stats or",
        "`--check-config`. Keep them out of flags (any local user can read a command",
        "line from `ps`); set them from the environment or a file only root can read.",
    ]
    for title, members in grouped(options):
        lines += ["", f"## {title}", "",
                  "| TOML key | flag | env | value | default | description |",
                  "|---|---|---|---|---|---|"]
        for option in members:
            toml_key = f"`{option.name}`"
            table = table_form(option, names)
            if table is not None:
                toml_key += f" or `{table[1]}` in `[{table[0]}]`"
            flag = flag_of(option)
            description = option.help[:1].upper() + option.help[1:]
            if option.secret:
                description = "**secret**: " + description
            lines.append("| " + " | ".join(_cell(cell) for cell in (
                toml_key, f"`{flag}`" if flag else "", f"`{option.env}`", _value_text(option),
                f"`{default_text(option)}`" if default_text(option) not in ("none", "required")
                else default_text(option),
                description,
            )) + " |")
    return "\n".join(lines) + "\n"


def render_example_toml(options: Sequence[Option]) -> str:
    """A skeleton config of every option, each commented out at its default."""
    lines = ["# sidecar.toml: every option at its default (generated by",
             "# `python -m sidecar.config.reference --toml`). Uncomment what you change."]
    for title, members in grouped(options):
        lines += ["", f"# --- {title} ---"]
        for option in members:
            secret = " (secret: prefer the env var " + option.env + ")" if option.secret else ""
            lines.append(f"# {option.help}{secret}")
            lines.append(f"#{option.name} = {toml_literal(option.default)}")
    return "\n".join(lines) + "\n"


def shown_value(setting: Setting) -> object:
    """The value as given, or `<set>`/`<unset>` for a secret (decided on the parsed value)."""
    if setting.option.secret:
        return SECRET_SET if setting.value not in (None, "", {}, (), []) else SECRET_UNSET
    return setting.raw


def file_form(setting: Setting) -> object:
    """The shown value as the config file takes it: env text and defaults such as
    "5", "false" or "" for a list become the TOML type the option takes."""
    shown = shown_value(setting)
    try:
        setting.option.file_type.check(shown)
    except ConfigError:
        value = setting.value
        if isinstance(value, (list, tuple)):
            return [str(item) for item in value]
        return value
    return shown


def effective_values(settings: Mapping[str, Setting]) -> dict[str, object]:
    """Every option -> a JSON-ready value as given, secrets redacted (the start-up log record)."""
    def plain(value: object) -> object:
        if isinstance(value, (str, int, float, bool)) or value is None:
            return value
        if isinstance(value, (list, tuple)):
            return [plain(item) for item in value]
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        return str(value)
    return {name: plain(shown_value(setting)) for name, setting in settings.items()}


def render_effective(settings: Mapping[str, Setting], source_names: Callable[[Setting], str]
                     ) -> str:
    """`--check-config` output: a loadable TOML listing with where each value came from."""
    rows = [(f"{name} = {toml_literal(file_form(setting))}", source_names(setting))
            for name, setting in settings.items()]
    width = max((len(row) for row, _ in rows), default=0)
    lines = ["# effective configuration (flag > env > file > default); secrets are not shown"]
    lines += [f"{row:<{width}}  # {source}" for row, source in rows]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args not in ([], ["--toml"]):
        print("usage: python -m sidecar.config.reference [--toml]", file=sys.stderr)
        return 2
    render = render_example_toml if args else render_markdown
    sys.stdout.write(render(OPTIONS))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
