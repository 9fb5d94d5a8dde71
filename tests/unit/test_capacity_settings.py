"""The capacity analysis reads the sidecars' read-ahead settings from their own
configuration file, even one that a serving sidecar would only accept with its
pod's secrets (an admin port off loopback, its token in the environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.config.loading import load_config, read_toml
from sidecar.errors import ConfigError
from spark_warmup.capacity.__main__ import replay_settings
from tests.support.deploy_files import manifests


def test_the_kubernetes_configmap_gives_the_sidecars_settings(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.toml"
    path.write_text(manifests()["ConfigMap"]["data"]["sidecar.toml"])
    with pytest.raises(ConfigError):
        load_config({}, {}, read_toml(path))  # a sidecar without its pod's secrets stops
    secrets = {"SIDECAR_ADMIN_TOKEN": "t" * 32, "SIDECAR_AUTH_KEYS": "kafka-broker:broker-secret"}
    served = load_config({}, secrets, read_toml(path))

    settings = replay_settings(path)

    assert settings.block_size == served.cache.block_size
    assert settings.max_coalesce_bytes == served.cache.max_coalesce_bytes
    assert settings.read_ahead == served.prefetch.enabled
    assert settings.max_window_bytes == served.prefetch.max_window_blocks * served.cache.block_size
    assert settings.max_in_flight == served.prefetch.max_in_flight
    assert settings.cache_share == served.prefetch.cache_share
    assert settings.stream_idle_s == served.prefetch.stream_idle_s
    assert settings.layout == served.prefetch.layout


def test_a_file_with_other_values_is_followed(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.toml"
    path.write_text('block_size = "4MiB"\nprefetch = false\nprefetch_max_window = "10MiB"\n')
    settings = replay_settings(path)
    assert settings.block_size == 4 * 1024 * 1024
    assert settings.max_window_bytes == 8 * 1024 * 1024  # whole blocks, as the sidecar's
    assert settings.read_ahead is False


@pytest.mark.parametrize(("text", "message"), [
    ('blok_size = "4MiB"\n', "unknown config key 'blok_size'"),
    ('block_size = "four"\n', "config key block_size"),
    ('block_size = "0"\n', "config key block_size: must be a multiple of 4KiB between 64KiB "
     "and 256MiB, as the sidecar requires, got 0"),
    ('block_size = "1"\n', "config key block_size: must be a multiple of 4KiB"),
    ('block_size = "65540"\n', "config key block_size: must be a multiple of 4KiB"),
    ('block_size = "512MiB"\n', "config key block_size: must be a multiple of 4KiB"),
    # Refused as out of range here, or by the sidecar's own parser once it says so itself.
    (f'block_size = "{"9" * 400}MiB"\n', "config key block_size: "),
    # A value of a TOML type the option does not take, as the sidecar refuses it.
    ("prefetch = 1\n", "config key prefetch: takes true or false, got an integer: 1"),
    ("block_size = 4194304.5\n", "config key block_size: takes an integer of bytes or a "
     "string"),
])
def test_a_bad_file_is_refused_with_the_key_named(tmp_path: Path, text: str,
                                                  message: str) -> None:
    path = tmp_path / "sidecar.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        replay_settings(path)


def test_max_coalesce_is_whole_blocks_as_the_sidecar_derives_it(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.toml"
    for given, expected in (("0", 4), ("6MiB", 4), ("10MiB", 8), ("64MiB", 64)):
        path.write_text(f'block_size = "4MiB"\nmax_coalesce = "{given}"\n')
        assert replay_settings(path).max_coalesce_bytes == expected * 1024 * 1024, given


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sidecar.toml"
    path.write_bytes('layout_prefix = "caf\u00e9/"\n'.encode("latin-1"))
    with pytest.raises(ConfigError, match=r"sidecar.toml is not UTF-8 \(byte 20\)"):
        replay_settings(path)
