"""The admin token's file and where clients find the token (sidecar.admin.token),
and the plan keys that give the warm-up job the token."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path

import pytest

from sidecar.admin.token import (
    client_token,
    ensure_token_file,
    read_token_file,
    untrusted_owner,
)
from sidecar.config import load_config
from sidecar.errors import ConfigError
from spark_warmup.plan import PlanError, parse_plan


def test_a_token_is_generated_once_with_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "admin.token"
    token, generated = ensure_token_file(path)
    assert generated and len(token) >= 40
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_token_file(path) == (token, False)
    assert ensure_token_file(tmp_path / "other.token")[0] != token


@pytest.mark.parametrize("content", [b"", b"\n", b"two words\n", b"tok\x1b[31m\n",
                                     b"\xff\xfe", b"x" * 5000])
def test_a_file_that_holds_no_token_is_refused(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "admin.token"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match="does not hold one token"):
        read_token_file(path)


def test_an_unwritable_place_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot create the admin token file"):
        ensure_token_file(tmp_path / "missing-dir" / "admin.token")


def test_clients_take_the_env_then_the_file_then_the_cache_dir(tmp_path: Path) -> None:
    named = tmp_path / "named.token"
    named.write_text("from-named\n")
    (tmp_path / "admin.token").write_text("from-cache-dir\n")
    assert client_token({"SIDECAR_ADMIN_TOKEN": "from-env",
                         "SIDECAR_ADMIN_TOKEN_FILE": str(named)}) == "from-env"
    assert client_token({"SIDECAR_ADMIN_TOKEN_FILE": str(named)}) == "from-named"
    assert client_token({}, named) == "from-named"
    assert client_token({"SIDECAR_CACHE_DIR": str(tmp_path)}) == "from-cache-dir"
    assert client_token({"SIDECAR_CACHE_DIR": str(tmp_path / "none")}) is None
    assert client_token({}) is None


def test_a_token_from_the_environment_is_trimmed_and_never_echoed() -> None:
    # A Kubernetes Secret mounted as a variable often ends in a newline.
    assert client_token({"SIDECAR_ADMIN_TOKEN": "s3cret-Token\n"}) == "s3cret-Token"
    for bad in ("two words", "s3cret\u20ac", "zq\nxy"):
        with pytest.raises(ConfigError) as refused:
            client_token({"SIDECAR_ADMIN_TOKEN": bad})
        assert str(refused.value).startswith("SIDECAR_ADMIN_TOKEN does not hold one token")
        assert bad.split()[0] not in str(refused.value)


def test_off_loopback_a_token_or_a_token_file_must_be_named() -> None:
    base = {"cache_dir": "/x", "admin_listen": "0.0.0.0:9331"}
    with pytest.raises(ConfigError, match="admin_token_file"):
        load_config(base, {}, {})
    config = load_config({**base}, {"SIDECAR_ADMIN_TOKEN_FILE": "/etc/s/admin.token"}, {})
    assert config.server.admin_token_file == Path("/etc/s/admin.token")
    assert load_config({"cache_dir": "/x"}, {}, {}).server.admin_token_file == \
        Path("/x/admin.token")


def test_metrics_listen_is_off_unless_given() -> None:
    assert load_config({"cache_dir": "/x"}, {}, {}).server.metrics_listen is None
    given = load_config({"cache_dir": "/x", "metrics_listen": "0.0.0.0:9332"}, {}, {})
    assert str(given.server.metrics_listen) == "0.0.0.0:9332"
    with pytest.raises(ConfigError, match="HOST:PORT"):
        load_config({"cache_dir": "/x", "metrics_listen": "0.0.0.0:９３３２"}, {}, {})


def plan(**extra: object) -> dict[str, object]:
    return {"origin": {"bucket": "tiered"}, "sidecars": {"a": "http://127.0.0.1:9331"},
            "replays": [{"topic": "orders"}], **extra}


def test_the_plan_reads_the_token_file_or_the_env(tmp_path: Path) -> None:
    path = tmp_path / "admin.token"
    path.write_text("tok-from-file\n")
    assert parse_plan(plan(admin_token_file=str(path)), env={}).admin_token == "tok-from-file"
    assert parse_plan(plan(), env={"SIDECAR_ADMIN_TOKEN_FILE": str(path)}).admin_token == \
        "tok-from-file"
    assert parse_plan(plan(), env={"SIDECAR_ADMIN_TOKEN": "t",
                                   "SIDECAR_ADMIN_TOKEN_FILE": str(path)}).admin_token == "t"
    with pytest.raises(PlanError, match="admin_token_file: cannot read"):
        parse_plan(plan(admin_token_file=str(tmp_path / "none")), env={})
    with pytest.raises(PlanError, match="not both"):
        parse_plan(json.loads(json.dumps(plan(admin_token="x", admin_token_file=str(path)))),
                   env={})


@pytest.mark.parametrize(("owner", "own", "untrusted"), [
    (1000, 1000, False),  # the sidecar's own user
    (0, 1000, False),  # root, who can read and write it anyway
    (0, 0, False),
    (1001, 1000, True),
    (65534, 0, True),  # nobody, though the sidecar runs as root
])
def test_a_token_file_is_trusted_from_root_or_the_sidecars_own_user(
        owner: int, own: int, untrusted: bool) -> None:
    assert untrusted_owner(owner, own) is untrusted


def test_a_token_file_another_user_owns_is_used_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "admin.token"
    path.write_text("planted-token\n")
    path.chmod(0o600)
    if os.geteuid() == 0:
        os.chown(path, 65534, -1)  # root gives it to another user
    owner = path.stat().st_uid
    # The sidecar's user: this test's, unless that owns the file (then another).
    own = os.geteuid() if owner != os.geteuid() else owner + 1
    with caplog.at_level(logging.WARNING, logger="sidecar.admin.token"):
        assert ensure_token_file(path, own) == ("planted-token", False)
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == (f"the admin token file {path} is owned by uid {owner}, neither root "
                       f"nor this sidecar's user (uid {own}): whoever wrote it knows the "
                       f"token; chown it to uid {own}, or delete it and restart for a new token")
    # Its own file, or root's: no warning.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="sidecar.admin.token"):
        ensure_token_file(path, owner)
    assert caplog.records == []
