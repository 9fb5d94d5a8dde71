from __future__ import annotations

import re
from pathlib import Path

import pytest

from sidecar.config import (
    HostPort,
    load_config,
    parse_duration,
    parse_rate,
    parse_size,
)
from sidecar.config.loading import read_toml
from sidecar.config.parsing import parse_cpu_list, parse_host_port, parse_sample_interval
from sidecar.config.tree import CacheConfig
from sidecar.errors import ConfigError

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "size"),
    [("8MiB", 8 * 2**20), ("10GiB", 10 * 2**30), ("500MB", 500 * 10**6), ("4096", 4096),
     ("1.5KiB", 1536), (" 2 kib ", 2048), (7, 7)],
)
def test_parse_size(text: object, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("text", ["", "8 MiBs", "-1", "MiB", "1e9", "8XB", True])
def test_parse_size_rejects(text: object) -> None:
    with pytest.raises(ConfigError, match="size"):
        parse_size(text)


def test_parse_rate_and_duration() -> None:
    assert parse_rate("100MiB/s") == 100 * 2**20
    assert parse_rate("unlimited") is None and parse_rate("0") is None
    with pytest.raises(ConfigError, match="rate"):
        parse_rate("100MiB")
    assert parse_duration("500ms") == 0.5 and parse_duration("2m") == 120 and parse_duration(3) == 3
    with pytest.raises(ConfigError, match="duration"):
        parse_duration("soon")


def test_the_stats_sampling_interval_is_bounded() -> None:
    assert parse_sample_interval("250ms") == 0.25 and parse_sample_interval("1m") == 60
    for bad in ("10ms", "2m", "0"):
        with pytest.raises(ConfigError, match="between 50ms and 1m"):
            parse_sample_interval(bad)


def test_parse_cpu_list() -> None:
    assert parse_cpu_list("2-3") == (2, 3)
    assert parse_cpu_list("0,2,4-5") == (0, 2, 4, 5)
    assert parse_cpu_list("") is None
    for bad in ("3-2", "a", "1-", "1,,2"):
        with pytest.raises(ConfigError, match="CPU list"):
            parse_cpu_list(bad)


def test_precedence_flag_over_env_over_file(tmp_path: Path) -> None:
    file_values = {"cache_dir": str(tmp_path), "cache_size": "2GiB", "block_size": "16MiB",
                   "origin_region": "eu-west-1"}
    env = {"SIDECAR_CACHE_SIZE": "3GiB", "SIDECAR_ORIGIN_REGION": "eu-central-1"}
    config = load_config({"cache_size": "4GiB"}, env, file_values)
    assert config.cache.size_bytes == 4 * 2**30
    assert config.origin.region == "eu-central-1"
    assert config.cache.block_size == 16 * 2**20
    assert config.cache.directory == tmp_path
    assert config.server.listen == HostPort("127.0.0.1", 9330)
    assert config.server.admin_listen == HostPort("127.0.0.1", 9331)
    assert config.cache.max_coalesce_bytes == 64 * 2**20


@pytest.mark.parametrize(
    ("flags", "file_values", "message"),
    [
        ({}, {}, "--cache-dir is required"),
        ({"cache_dir": "/x", "block_size": "1000"}, {}, "--block-size must be a multiple"),
        ({"cache_dir": "/x", "cache_size": "1MiB"}, {}, "cannot hold one block"),
        ({"cache_dir": "/x", "cache_size": "big"}, {}, "--cache-size: not a size"),
        ({"cache_dir": "/x", "admin_listen": "0.0.0.0:9331"}, {}, "--admin-token"),
        ({"cache_dir": "/x"}, {"cache_sise": "1GiB"},
         "unknown config key 'cache_sise'; did you mean 'cache_size'?"),
        ({"cache_dir": "/x"}, {"colour": "blue"},
         "unknown config key 'colour' (every key is listed in docs/CONFIG.md)"),
        ({"cache_dir": "/x"}, {"block_size": "lots"}, "config key block_size"),
        ({"cache_dir": "/x", "listen": "nowhere"}, {}, "HOST:PORT"),
        ({"cache_dir": "/x"}, {"origin_deadline": "0s"}, "origin_deadline must be more than 0"),
        ({"cache_dir": "/x", "ionice": "idle:3"}, {},
         "not an I/O priority: 'idle:3' (the idle class takes no level: give idle)"),
        ({"cache_dir": "/x"}, {"warm_share": 0},
         "warm_share must be more than 0 (its lane would never read from the origin); "
         "give it a small share such as 0.05"),
        ({"cache_dir": "/x", "origin_bandwidth": "100MiB/s"}, {"prefetch_share": 0.0},
         "prefetch_share must be more than 0"),
        ({"cache_dir": "/x", "origin_bandwidth": "1KiB/s"}, {},
         "origin_bandwidth 1KiB/s is too low: one 8MiB block would take 2.28 h to read; "
         "give at least 1MiB/s, or unlimited"),
        ({"cache_dir": "/x", "block_size": "128MiB", "cache_size": "1GiB"},
         {"origin_bandwidth": "2MiB/s"}, "block would take 1.07 min to read; give at least "
         "2185KiB/s, or unlimited"),
        ({"cache_dir": "/x", "origin_bandwidth": "2MiB/s"}, {"warm_share": 0.01},
         "warm_share 0.01 of origin_bandwidth 2MiB/s gives the warm-up lane 20.48KiB/s, under "
         "one 8MiB block a minute (137KiB/s); raise warm_share or origin_bandwidth"),
        ({"cache_dir": "/x", "origin_bandwidth": "1MiB/s"}, {"prefetch_share": 0.1},
         "prefetch_share 0.1 of origin_bandwidth 1MiB/s gives the read-ahead lane"),
    ],
)
def test_bad_config_is_a_clear_error(
    flags: dict[str, object], file_values: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(flags, {}, file_values)


@pytest.mark.parametrize("block_size", ["64KiB", "8MiB", "256MiB"])
def test_the_bandwidth_floors_themselves_are_accepted(block_size: str) -> None:
    from sidecar.config.bandwidth import lane_rate_floor, origin_rate_floor
    from sidecar.config.parsing import parse_size

    size = parse_size(block_size)
    floor = origin_rate_floor(size)
    share = lane_rate_floor(size) / floor
    values = {"cache_dir": "/x", "block_size": block_size, "cache_size": "1GiB",
              "origin_bandwidth": floor}
    config = load_config(values, {}, {"warm_share": share, "prefetch_share": share})
    assert config.origin.bandwidth == floor
    assert load_config({**values, "origin_bandwidth": "unlimited"}, {},
                       {"warm_share": 0.001}).origin.bandwidth is None
    with pytest.raises(ConfigError, match=r"origin_bandwidth .* is too low"):
        load_config({**values, "origin_bandwidth": floor - 1024}, {}, {})


def test_env_source_named_in_error() -> None:
    with pytest.raises(ConfigError, match="SIDECAR_CACHE_SIZE"):
        load_config({"cache_dir": "/x"}, {"SIDECAR_CACHE_SIZE": "lots"}, {})


def test_non_loopback_admin_with_token_is_allowed() -> None:
    config = load_config(
        {"cache_dir": "/x", "admin_listen": "0.0.0.0:9331", "admin_token": "s3cret"}, {}, {}
    )
    assert config.server.admin_token == "s3cret"


def test_every_field_of_the_tree_is_filled_exactly_once() -> None:
    """By the one option that names it, or by one derivation: no default repeated
    in the tree, no field forgotten, no option that fills nothing."""
    from sidecar.config.loading import derive, resolve, tree_fields
    from sidecar.config.options import OPTIONS

    named = [option.field for option in OPTIONS if option.field]
    assert len(named) == len(set(named))
    values = {name: setting.value for name, setting in
              resolve({"cache_dir": "/tmp"}, {}, {}).items()}
    derived = [f"{section}.{name}" for section, filled in derive(values).items()
               for name in filled]
    assert not set(named) & set(derived), set(named) & set(derived)
    every = {f"{section}.{name}" for section, names in tree_fields().items() for name in names}
    assert sorted(named + derived) == sorted(every)
    feeds = {"cache_dir", "max_coalesce", "prefetch_share",
             "warm_share", "auth_keys", "auth_keys_file", "auth_allow_anonymous",
             "admin_token_file"}
    assert {option.name for option in OPTIONS if not option.field} == feeds


def test_the_keys_file_is_read_while_loading_not_while_building(tmp_path: Path) -> None:
    from sidecar.config.loading import build_config, resolve

    keys_file = tmp_path / "keys"
    keys_file.write_text("# mounted secret\nAKID1:secret-one\n")
    settings = resolve({"cache_dir": str(tmp_path)}, {"SIDECAR_AUTH_KEYS": "AKID2:two"},
                       {"auth_keys_file": str(keys_file)})
    assert settings["auth_keys"].value == {"AKID2": "two", "AKID1": "secret-one"}
    keys_file.unlink()  # building reads no file: what was loaded is what counts
    config = build_config(settings)
    assert dict(config.auth.keys) == {"AKID2": "two", "AKID1": "secret-one"}
    assert not config.auth.allow_anonymous


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("::1", "an IPv6 address is written in brackets, e.g. [::1]:9330"),
        ("fe80::1:9330", "an IPv6 address is written in brackets, e.g. [::1]:9330"),
        ("[::1", "not a HOST:PORT address"),
        ("::1]:9330", "not a HOST:PORT address"),
        ("[::1:9330", "not a HOST:PORT address"),
        ("[]:9330", "not a HOST:PORT address"),
    ],
)
def test_an_ipv6_address_without_its_brackets_or_its_port_is_refused(text: str, says: str
                                                                     ) -> None:
    """Not taken as host ':' and port 1 (bound, or refused by the system, as
    an address nobody wrote)."""
    with pytest.raises(ConfigError) as refused:
        parse_host_port(text)
    assert says in str(refused.value) and repr(text) in str(refused.value)


@pytest.mark.parametrize(
    ("text", "shown", "url"),
    [
        ("127.0.0.1:9330", "127.0.0.1:9330", "http://127.0.0.1:9330"),
        ("[::1]:9330", "[::1]:9330", "http://[::1]:9330"),
        ("localhost:9331", "localhost:9331", "http://localhost:9331"),
    ],
)
def test_an_address_is_shown_and_made_a_url_as_rfc_3986_writes_it(
    text: str, shown: str, url: str
) -> None:
    address = parse_host_port(text)
    assert str(address) == shown and address.url == url
    assert parse_host_port(str(address)) == address


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("SIDECAR_CACHE_SIZE", "9" * 400, "too large a size"),
        ("SIDECAR_CACHE_SIZE", "99999999999999999999999999999", "at most 1EiB"),
        ("SIDECAR_ORIGIN_BANDWIDTH", "9" * 400 + ".5GiB/s", "too large a size"),
        ("SIDECAR_ORIGIN_BANDWIDTH", "0.5/s", "less than a byte a second"),
        ("SIDECAR_HEAD_TTL", "nan", "not a duration"),
        ("SIDECAR_CLIENT_TIMEOUT", "99999999999999999999h", "at most 1000 days"),
        ("SIDECAR_CPUS", "0-99999999", "at most 8191"),
        ("SIDECAR_CPUS", "\u00b2", "not a CPU list"),
        ("SIDECAR_MAX_REQUESTS", "9" * 5000, "(5002 characters)"),
    ],
)
def test_values_past_any_machine_are_short_clear_errors(name: str, value: str,
                                                        says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_config({"cache_dir": "/x"}, {name: value}, {})
    assert says in str(refused.value) and len(str(refused.value)) < 200, str(refused.value)


def test_a_config_file_must_be_utf8_and_may_start_with_a_byte_order_mark(
        tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.toml"
    latin1.write_bytes('# caché\ncache_dir = "/x"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.toml is not UTF-8 \(byte 6\)"):
        read_toml(latin1)
    marked = tmp_path / "bom.toml"
    marked.write_bytes(b'\xef\xbb\xbfcache_dir = "/x"\n')
    assert read_toml(marked) == {"cache_dir": "/x"}


def test_a_config_file_nested_past_the_parser_is_refused_in_one_line(tmp_path: Path) -> None:
    """No traceback (at start, the process's last words; at a reload, an
    unhandled error): the file and what is wrong with it."""
    deep = tmp_path / "deep.toml"
    deep.write_text("a = " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError) as refused:
        read_toml(deep)
    assert str(refused.value) == f"cannot read config file {deep}: nested too deeply"


def test_an_option_given_twice_in_the_file_is_refused_and_a_group_table_is_read(
        tmp_path: Path) -> None:
    twice = tmp_path / "twice.toml"
    twice.write_text('cache_dir = "/x"\ncache_size = "2GiB"\n[cache]\nsize = "3GiB"\n')
    with pytest.raises(ConfigError, match=r"cache_size is given twice in the config file"):
        load_config({}, {}, read_toml(twice))
    grouped = tmp_path / "grouped.toml"
    grouped.write_text('cache_dir = "/x"\n[prefetch]\nmax_window = "24MiB"\n'
                       '[auth.keys]\nAKIDTABLE = "a-long-random-secret"\n')
    config = load_config({}, {}, read_toml(grouped))
    assert config.prefetch.max_window_blocks == 3  # 24MiB of 8MiB blocks
    assert "AKIDTABLE" in config.auth.keys


def test_a_negative_rate_from_the_file_is_refused() -> None:
    with pytest.raises(ConfigError, match="must not be negative"):
        load_config({"cache_dir": "/x", "origin_bandwidth": -5}, {}, {})


@pytest.mark.parametrize(
    ("text", "loopback"),
    [("127.0.0.1:1", True), ("127.3.2.1:1", True), ("[::1]:1", True), ("localhost:1", True),
     ("127.example.net:1", False), ("127.0.0.1.nip.io:1", False), ("0.0.0.0:1", False),
     ("[::]:1", False), ("10.0.0.7:1", False), ("node-a:1", False)],
)
def test_loopback_is_an_address_not_a_prefix(text: str, loopback: bool) -> None:
    assert parse_host_port(text).is_loopback is loopback


def test_an_admin_port_off_loopback_without_a_token_names_every_way_to_set_one() -> None:
    with pytest.raises(ConfigError) as refused:
        load_config({"cache_dir": "/x"}, {"SIDECAR_ADMIN_LISTEN": "0.0.0.0:9331"}, {})
    message = str(refused.value)
    assert message.startswith("admin_listen 0.0.0.0:9331 is not loopback: set admin_token")
    assert all(form in message for form in ("--admin-token", "SIDECAR_ADMIN_TOKEN",
                                            "admin_token in the config file"))


def test_the_memory_tier_is_auto_by_default_a_share_of_the_cache_never_too_small(
) -> None:
    from sidecar.config.loading import load_config

    def tier(**flags: object) -> int:
        return load_config({"cache_dir": "/c", **flags}, {}, {}).cache.memory_tier_bytes

    assert tier(cache_size="4GiB") == 256 * MIB  # auto by default
    assert tier(cache_size="4GiB", memory_tier="auto") == 256 * MIB  # the cap
    assert tier(cache_size="100MiB", memory_tier="auto") == 12 * MIB  # an eighth, whole chunks
    assert tier(cache_size="3MiB", block_size="64KiB", memory_tier="auto") == 384 * 1024
    assert tier(cache_size="4GiB", memory_tier="0") == 0
    assert load_config({"cache_dir": "/c"}, {"SIDECAR_MEMORY_TIER": "32MiB"},
                       {}).cache.memory_tier_bytes == 32 * MIB
    with pytest.raises(ConfigError, match="memory_tier 4096 cannot hold one chunk"):
        tier(memory_tier="4KiB")
    with pytest.raises(ConfigError, match="size"):
        tier(memory_tier="lots")


def test_an_auto_memory_tier_too_small_for_a_chunk_says_why_it_is_off() -> None:
    """Asked for (auto) on a cache whose eighth holds no chunk: off, and the
    start warns with what to set, rather than /ui saying "off" unexplained."""
    def cache(**flags: object) -> CacheConfig:
        return load_config({"cache_dir": "/c", **flags}, {}, {}).cache

    tiny = cache(cache_size="7MiB", block_size="1MiB", memory_tier="auto")
    assert tiny.memory_tier_bytes == 0
    assert tiny.memory_tier_off_reason == (
        "memory_tier auto is an eighth of cache_size (917504 bytes), less than one chunk of "
        "1048576 bytes: the memory tier is off; give memory_tier a size of at least 1048576 "
        "bytes to have one")
    assert cache(cache_size="100MiB", memory_tier="auto").memory_tier_off_reason is None
    for unasked in ("0", None):  # none asked for, or left at auto, its default: nothing to say
        flags = {} if unasked is None else {"memory_tier": unasked}
        assert cache(cache_size="7MiB", block_size="1MiB", **flags).memory_tier_off_reason is None
    assert cache(cache_size="100MiB").memory_tier_bytes == 12 * MIB  # whole chunks


def test_the_config_knows_the_cache_chunk_size_the_slab_uses() -> None:
    from sidecar.cache.slot_format import chunk_size_for
    from sidecar.config.tree import chunk_bytes

    for block_size in (64 * 1024, 1024 * 1024, 1536 * 1024, 8 * MIB, 256 * MIB):
        assert chunk_bytes(block_size) == chunk_size_for(block_size)


@pytest.mark.parametrize(("toml", "message"), [
    # Each was once taken as str() of the value: the path "5", a bucket list of
    # one, a boolean from a number, one byte of cache.
    ("protect_path = 5", "config key protect_path: takes an array of strings, got an "
     "integer: 5"),
    ("protect_path = true", "config key protect_path: takes an array of strings, got a boolean"),
    ('protect_path = ["/a", 5]', "config key protect_path: takes an array of strings, got an "
     "array holding an integer: 5"),
    ('protect_path = {a = "/x"}', "config key protect_path: takes an array of strings, got a "
     "table"),
    ('access_buckets = "mybucket"', "config key access_buckets: takes an array of strings, "
     "got a string: 'mybucket'"),
    ('access_copy_sources = {b = "x"}', "config key access_copy_sources: takes an array of "
     "strings, got a table"),
    ("cache_dir = 7", "config key cache_dir: takes a string, got an integer: 7"),
    ("admin_token_file = false", "config key admin_token_file: takes a string, got a boolean"),
    ("access_log = 1", "config key access_log: takes a string, got an integer"),
    ("prefetch = 1", "config key prefetch: takes true or false, got an integer: 1"),
    ('preallocate = "no"', "config key preallocate: takes true or false, got a string: 'no'"),
    ("[access]\nbucket_admin = 0", "config key access_bucket_admin: takes true or false"),
    ("cache_size = 1.5", "config key cache_size: takes an integer of bytes or a string such "
     'as "64MiB", got a float: 1.5'),
    ('origin_retries = "3"', "config key origin_retries: takes an integer, got a string"),
    ("nice = true", "config key nice: takes an integer, got a boolean"),
    ('origin_breaker_ratio = "0.5"', "config key origin_breaker_ratio: takes a number"),
    ("stats_interval = 2026-01-01", "config key stats_interval: takes a number of seconds or "
     "a string"),
    ("origin_bandwidth = [1]", "config key origin_bandwidth: takes an integer of bytes a "
     "second"),
    ("[auth]\nscopes = {AKID1 = 5}", "config key auth_scopes: takes a table of strings"),
])
def test_a_file_value_of_a_type_the_option_does_not_take_is_refused(
    tmp_path: Path, toml: str, message: str
) -> None:
    path = tmp_path / "sidecar.toml"
    path.write_text(f'{toml}\n' if toml.startswith("cache_dir") else
                    f'cache_dir = "{tmp_path}"\n{toml}\n')
    with pytest.raises(ConfigError) as caught:
        load_config({}, {}, read_toml(path))
    assert str(caught.value).startswith(message), str(caught.value)
    assert "\n" not in str(caught.value)


def test_a_secret_of_the_wrong_type_is_refused_without_being_shown(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({}, {}, {"cache_dir": str(tmp_path), "admin_token": 918273645})
    assert str(caught.value) == "config key admin_token: takes a string, got an integer"


def test_every_spelling_the_file_took_of_each_type_still_loads(tmp_path: Path) -> None:
    config = load_config({}, {}, {
        "cache_dir": str(tmp_path), "cache_size": 4 * 2**30, "block_size": "4MiB",
        "max_coalesce": 32 * MIB, "memory_tier": "auto", "origin_bandwidth": "100MiB/s",
        "scrub_rate": 0, "head_ttl": 30, "listing_ttl": 2.5, "client_timeout": "1m",
        "origin_breaker_ratio": 1, "prefetch_share": 0.5, "cpus": 2, "prefetch": False,
        "protect_path": ["/a", "/b"], "access": {"buckets": ["kafka-tiered"]},
        "auth": {"keys": "AKID1:one", "scopes": {"AKID1": "read"}},
    })
    assert config.cache.size_bytes == 4 * 2**30 and config.cache.block_size == 4 * MIB
    assert config.origin.bandwidth == 100 * MIB and config.cache.scrub_rate is None
    assert config.origin.head_ttl_s == 30 and config.origin.listing_ttl_s == 2.5
    assert config.origin.breaker_ratio == 1.0 and config.server.cpus == (2,)
    assert config.prefetch.enabled is False and config.access.buckets == ("kafka-tiered",)
    assert config.cache.protect_paths == (Path("/a"), Path("/b"))


def test_every_option_names_the_toml_types_it_takes() -> None:
    from sidecar.config.options import OPTIONS

    for option in OPTIONS:
        # The default, as an operator would copy it from the example config, is taken.
        option.file_type.check(option.default if option.file_type.types != (list,) else [])


@pytest.mark.parametrize(("env", "message"), [
    # int(), float() and \d take other scripts' digits and "1_000"; an operator's
    # number is ASCII decimal.
    ({"SIDECAR_ORIGIN_RETRIES": "\u0663"}, "SIDECAR_ORIGIN_RETRIES: not a whole number"),
    ({"SIDECAR_MAX_REQUESTS": "1_000"}, "SIDECAR_MAX_REQUESTS: not a whole number"),
    ({"SIDECAR_NICE": "-\u0663"}, "SIDECAR_NICE: not a nice value"),
    ({"SIDECAR_PREFETCH_SHARE": "\u0660.\u0665"}, "SIDECAR_PREFETCH_SHARE: not a number"),
    ({"SIDECAR_ORIGIN_BREAKER_RATIO": "nan"}, "SIDECAR_ORIGIN_BREAKER_RATIO: not a number"),
    ({"SIDECAR_HEAD_TTL": "\u0663s"}, "SIDECAR_HEAD_TTL: not a duration"),
    ({"SIDECAR_CACHE_SIZE": "\u0663GiB"}, "SIDECAR_CACHE_SIZE: not a size"),
    ({"SIDECAR_ORIGIN_BANDWIDTH": "\u0663MiB/s"}, "SIDECAR_ORIGIN_BANDWIDTH: not a size"),
])
def test_numbers_from_the_environment_are_ascii_decimal(env: dict[str, str],
                                                        message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config({"cache_dir": "/x"}, env, {})
    assert str(caught.value).startswith(message), str(caught.value)


def test_ascii_numbers_in_every_form_still_load() -> None:
    config = load_config({"cache_dir": "/x"}, {
        "SIDECAR_ORIGIN_RETRIES": " 5 ", "SIDECAR_NICE": "-3", "SIDECAR_PREFETCH_SHARE": ".5",
        "SIDECAR_ORIGIN_BREAKER_RATIO": "1e-1", "SIDECAR_MAX_REQUESTS": "+300"}, {})
    assert config.origin.retries == 5 and config.server.nice == -3
    assert config.origin.prefetch_share == 0.5 and config.origin.breaker_ratio == 0.1
    assert config.server.max_requests == 300


@pytest.mark.parametrize("token", ["two words", "caf\u00e9-token", "line\x01break"])
def test_an_admin_token_no_client_could_send_is_refused_without_being_shown(
    tmp_path: Path, token: str
) -> None:
    """Accepted, it matched no request: clients refuse it, HTTP strips or refuses it."""
    for flags, env, file in (({"admin_token": token}, {}, {}),
                             ({}, {"SIDECAR_ADMIN_TOKEN": token}, {}),
                             ({}, {}, {"admin_token": token})):
        with pytest.raises(ConfigError) as caught:
            load_config({"cache_dir": str(tmp_path), **flags}, env, file)
        assert re.sub("[-_]", "", str(caught.value).lower()).find("admintoken") >= 0
        assert "not one token" in str(caught.value)
        assert token not in str(caught.value)
    # A Secret mounted as a variable ends in a newline: still one token.
    config = load_config({"cache_dir": str(tmp_path)}, {"SIDECAR_ADMIN_TOKEN": "s3cret\n"}, {})
    assert config.server.admin_token == "s3cret"


@pytest.mark.parametrize(("name", "reason"), [
    (".", "cannot name a folder"), ("..", "cannot name a folder"),
    ("broker\x01one", "a control character"), ("b" * 256, "256 characters"),
])
def test_a_node_name_no_folder_can_have_is_refused(tmp_path: Path, name: str,
                                                   reason: str) -> None:
    """It names the node's folder of shipped access logs."""
    with pytest.raises(ConfigError) as caught:
        load_config({"cache_dir": str(tmp_path)}, {"SIDECAR_NODE_NAME": name}, {})
    assert "node_name" in str(caught.value).lower() and reason in str(caught.value)
    assert len(str(caught.value)) < 200
    config = load_config({"cache_dir": str(tmp_path)}, {"SIDECAR_NODE_NAME": "rack-1/broker-3"},
                         {})
    assert config.server.node_name == "rack-1/broker-3"
