"""The config reference, the example config and the effective-config display.

docs/CONFIG.md and sidecar.example.toml are checked against the live OPTIONS
table, so an option added to sidecar/config/options.py without its documentation fails
here, with a message saying what to do.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from sidecar.cli import build_parser
from sidecar.config import OPTIONS, Option, flatten_sections, parse_size, resolve
from sidecar.config.options import BY_NAME
from sidecar.config.reference import (
    SECRET_SET,
    SECRET_UNSET,
    effective_values,
    flag_of,
    group_of,
    grouped,
    main,
    render_effective,
    render_example_toml,
    render_markdown,
    table_form,
    toml_literal,
)

ROOT = Path(__file__).resolve().parents[2]
NAMES = [option.name for option in OPTIONS]
# `#key = value` and `#[table]`: a commented-out setting, not prose.
_SETTING = re.compile(r"^#\s?((?:[a-z][a-z0-9_]*\s*=.*)|(?:\[[a-z_]+\]))$")
# Example lines that show an illustrative value, not the default.
_ILLUSTRATIVE = {"auth_keys"}


def test_docs_config_md_is_the_render_of_the_live_options() -> None:
    on_disk = (ROOT / "docs" / "CONFIG.md").read_text(encoding="utf-8")
    assert on_disk == render_markdown(OPTIONS), (
        "docs/CONFIG.md is stale: an option in sidecar/config/options.py changed; "
        "run `make config-docs`"
    )


def test_reference_documents_every_option_once_with_env_and_default() -> None:
    text = render_markdown(OPTIONS)
    for option in OPTIONS:
        rows = [line for line in text.splitlines() if line.startswith(f"| `{option.name}`")]
        assert len(rows) == 1, option.name
        assert f"`{option.env}`" in rows[0]
        if option.secret:
            assert "**secret**" in rows[0]


def test_every_flag_in_the_reference_is_accepted_by_serve() -> None:
    parser = build_parser()
    for option in OPTIONS:
        flag = flag_of(option)
        if flag is None:
            continue
        argv = ["serve", *flag.split(" ", 1)[:1]]
        if option.kind not in ("switch",) and option.name != "prefetch":
            argv.append("x")
        args = parser.parse_args(argv)
        assert hasattr(args, option.name), flag


def test_table_form_only_for_section_tables_that_flatten_back() -> None:
    auth_keys = next(option for option in OPTIONS if option.name == "auth_keys")
    assert table_form(auth_keys, NAMES) == ("auth", "keys")
    layout_prefix = next(option for option in OPTIONS if option.name == "layout_prefix")
    assert table_form(layout_prefix, NAMES) is None  # `[layout]` is not a section
    for option in OPTIONS:
        form = table_form(option, NAMES)
        if form is not None:
            assert flatten_sections({form[0]: {form[1]: 1}}) == {option.name: 1}


def test_groups_follow_the_option_field_then_the_name() -> None:
    assert group_of(Option("scrub_interval", str, "", "h")) == "cache"
    assert group_of(Option("zzz", str, "", "h")) == "other"
    assert group_of(Option("zzz", str, "", "h", group="origin")) == "origin"
    sections = grouped([Option("zzz", str, "", "h", group="brand-new"), *OPTIONS])
    assert sections[-1] == ("brand-new", [Option("zzz", str, "", "h", group="brand-new")])
    assert sum(len(members) for _, members in sections) == len(OPTIONS) + 1


@pytest.mark.parametrize(
    ("value", "literal"),
    [(True, "true"), (3, "3"), (0.25, "0.25"), ("8MiB", '"8MiB"'), ('a"b', '"a\\"b"'),
     (["a", 1], '["a", 1]'), ({"AK": "S"}, '{"AK" = "S"}')],
)
def test_toml_literals_load_back(value: object, literal: str) -> None:
    assert toml_literal(value) == literal
    assert tomllib.loads(f"x = {literal}")["x"] == value


def _uncommented(text: str) -> dict[str, Any]:
    """The example with every commented-out setting switched on."""
    lines = []
    for line in text.splitlines():
        match = _SETTING.match(line)
        lines.append(match.group(1) if match else line)
    return tomllib.loads("\n".join(lines))


def _commented_names(text: str) -> set[str]:
    names: set[str] = set()
    table = ""
    for line in text.splitlines():
        match = _SETTING.match(line) or re.match(r"^((?:[a-z][a-z0-9_]*\s*=.*)|(?:\[[a-z_]+\]))$",
                                                 line)
        if not match:
            continue
        body = match.group(1)
        if body.startswith("["):
            table = body.strip("[]")
        elif line.startswith("#"):
            key = body.partition("=")[0].strip()
            names.add(f"{table}_{key}" if table else key)
    return names


def test_example_toml_names_every_option() -> None:
    text = (ROOT / "sidecar.example.toml").read_text(encoding="utf-8")
    given = set(flatten_sections(tomllib.loads(text)))
    everything = set(flatten_sections(_uncommented(text)))
    missing = sorted(set(NAMES) - everything)
    assert not missing, (
        f"sidecar.example.toml does not mention {missing}: add each, commented out at its "
        "default, with a comment saying when an operator changes it"
    )
    assert everything <= set(NAMES), sorted(everything - set(NAMES))
    assert given == {"origin_endpoint", "origin_region", "cache_dir", "cache_size"}


def test_example_toml_shows_the_real_defaults() -> None:
    text = (ROOT / "sidecar.example.toml").read_text(encoding="utf-8")
    commented = _commented_names(text)
    values = flatten_sections(_uncommented(text))
    by_name = {option.name: option for option in OPTIONS}
    for name in sorted(commented - _ILLUSTRATIVE):
        option = by_name[name]
        assert option.parse(values[name]) == option.parse(option.default), (
            f"sidecar.example.toml shows {name} = {values[name]!r}, the default is "
            f"{option.default!r}"
        )
    # Switched on all together, the example still loads (with a key for [auth]).
    settings = resolve({}, {}, values)
    assert settings["cache_size"].value == parse_size("200GiB")


def test_generated_skeleton_loads_back_to_the_defaults() -> None:
    skeleton = render_example_toml(OPTIONS)
    values = flatten_sections(_uncommented(skeleton))
    assert sorted(values) == sorted(NAMES)
    for option in OPTIONS:
        assert option.parse(values[option.name]) == option.parse(option.default), option.name


def test_effective_values_redact_secrets_and_keep_the_rest() -> None:
    settings = resolve(
        {"cache_dir": "/c"},
        {"SIDECAR_ADMIN_TOKEN": "hunter2", "SIDECAR_AUTH_KEYS": "AK1:topsecret"},
        {"auth": {"allow_anonymous": False}, "protect_path": ["/a", "/b"]},
    )
    shown = effective_values(settings)
    assert shown["admin_token"] == SECRET_SET and shown["auth_keys"] == SECRET_SET
    assert shown["cache_dir"] == "/c" and shown["protect_path"] == ["/a", "/b"]
    assert shown["auth_allow_anonymous"] is False
    assert "hunter2" not in repr(shown) and "topsecret" not in repr(shown)
    assert effective_values(resolve({}, {}, {}))["admin_token"] == SECRET_UNSET
    listing = render_effective(settings, lambda setting: setting.source)
    assert "hunter2" not in listing and "topsecret" not in listing
    assert 'cache_dir = "/c"' in listing and "# flag" in listing
    # The listing is itself a loadable config: every line is TOML.
    loaded = tomllib.loads(listing)
    assert sorted(loaded) == sorted(NAMES)


def test_main_prints_markdown_or_toml(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert capsys.readouterr().out == render_markdown(OPTIONS)
    assert main(["--toml"]) == 0
    assert capsys.readouterr().out == render_example_toml(OPTIONS)
    assert main(["--bogus"]) == 2
    assert "usage" in capsys.readouterr().err


def test_the_readme_counts_the_options_there_are() -> None:
    readme = (ROOT / "README.md").read_text()
    counted = re.search(r"Every option \((\d+) of them", readme)
    assert counted, "README.md no longer counts the options"
    assert int(counted.group(1)) == len(OPTIONS)


def test_the_listing_of_env_values_and_defaults_loads_back_as_the_file_takes_them() -> None:
    env = {"SIDECAR_ORIGIN_RETRIES": "5", "SIDECAR_PREFETCH": "no",
           "SIDECAR_PROTECT_PATH": "/a,/b", "SIDECAR_ORIGIN_BREAKER_RATIO": "0.75"}
    settings = resolve({"cache_dir": "/c"}, env, {})
    listing = render_effective(settings, lambda setting: setting.source)
    loaded = {name: value for name, value in tomllib.loads(listing).items()
              if not BY_NAME[name].secret}
    assert loaded["origin_retries"] == 5 and loaded["prefetch"] is False
    assert loaded["protect_path"] == ["/a", "/b"] and loaded["access_buckets"] == []
    again = resolve({}, {}, loaded)
    assert {name: again[name].value for name in loaded} == \
        {name: settings[name].value for name in loaded}
