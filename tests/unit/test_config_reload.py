"""What a reloaded configuration changes at once and what waits for a restart."""

from __future__ import annotations

from sidecar.config import load_config
from sidecar.config.options import BY_NAME
from sidecar.config.reloading import LIVE_FIELDS, option_of, plan_reload

BASE = {"cache_dir": "/x"}


def test_nothing_changed_is_nothing_to_do() -> None:
    running = load_config(BASE, {}, {})
    plan = plan_reload(running, load_config(BASE, {}, {}))
    assert plan.applied == () and plan.needs_restart == () and plan.config == running


def test_live_options_are_taken_and_the_rest_waits_for_a_restart() -> None:
    running = load_config(BASE, {}, {"origin_bandwidth": "100MiB/s", "cache_size": "1GiB"})
    loaded = load_config(BASE, {"SIDECAR_AUTH_KEYS": "AKID1:secret-1"}, {
        "origin_bandwidth": "50MiB/s", "warm_share": 0.2, "max_requests": 32,
        "prefetch_max_window": "16MiB", "cache_size": "2GiB", "listen": "127.0.0.1:9999",
    })
    plan = plan_reload(running, loaded)
    assert sorted(plan.applied) == ["auth_keys", "max_requests", "origin_bandwidth",
                                    "prefetch_max_window", "warm_share"]
    assert sorted(plan.needs_restart) == ["cache_size", "listen"]
    new = plan.config
    assert new.origin.bandwidth == 50 * 2**20 and new.origin.warm_share == 0.2
    assert new.server.max_requests == 32 and dict(new.auth.keys) == {"AKID1": "secret-1"}
    assert new.prefetch.max_window_blocks == loaded.prefetch.max_window_blocks
    # What needs a restart keeps its running value until then.
    assert new.cache.size_bytes == running.cache.size_bytes
    assert new.server.listen == running.server.listen


def test_every_live_field_names_a_real_option() -> None:
    for path in LIVE_FIELDS:
        assert option_of(path) in BY_NAME, path


def test_a_new_block_size_waiting_for_a_restart_leaves_the_window_as_it_is() -> None:
    """The window is prefetch_max_window in blocks: a file whose block_size
    changed (a restart's matter) neither names prefetch_max_window as changed
    nor sets a window counted in blocks the running sidecar does not read."""
    running = load_config(BASE, {}, {"block_size": "8MiB", "prefetch_max_window": "64MiB"})
    loaded = load_config(BASE, {}, {"block_size": "1MiB", "prefetch_max_window": "64MiB"})
    plan = plan_reload(running, loaded)
    assert plan.applied == () and plan.needs_restart == ("block_size",)
    assert plan.config.prefetch.max_window_blocks == 8  # 64MiB of the running 8MiB blocks
    # A new window, with the new block size alike: counted in the running blocks.
    loaded = load_config(BASE, {}, {"block_size": "1MiB", "prefetch_max_window": "16MiB"})
    plan = plan_reload(running, loaded)
    assert plan.applied == ("prefetch_max_window",) and plan.needs_restart == ("block_size",)
    assert plan.config.prefetch.max_window_blocks == 2


def test_the_memory_tiers_default_written_out_changes_nothing() -> None:
    running = load_config(BASE, {}, {})
    plan = plan_reload(running, load_config(BASE, {}, {"memory_tier": "auto"}))
    assert plan.applied == () and plan.needs_restart == ()
    plan = plan_reload(running, load_config(BASE, {}, {"memory_tier": "0"}))
    assert plan.needs_restart == ("memory_tier",)


def test_every_field_of_the_tree_is_named_by_an_option() -> None:
    """What a reload says needs a restart is an option the operator can find in
    the file and in docs/CONFIG.md, never a field of the tree."""
    from sidecar.config.loading import tree_fields

    for section, names in tree_fields().items():
        for name in names:
            assert option_of(f"{section}.{name}") in BY_NAME, f"{section}.{name}"


def test_a_new_cache_dir_is_named_as_the_option_it_is() -> None:
    running = load_config(BASE, {}, {"max_coalesce": "64MiB"})
    loaded = load_config({"cache_dir": "/y"}, {}, {"max_coalesce": "32MiB"})
    assert sorted(plan_reload(running, loaded).needs_restart) == [
        "admin_token_file", "cache_dir", "max_coalesce"]
