"""The admin token: where it comes from, and the file a generated one is kept in.

A token always guards the admin port's mutating calls. An operator may give one
(`admin_token`, SIDECAR_ADMIN_TOKEN); with none given, the first start writes a
random one to `admin_token_file` (default `<cache_dir>/admin.token`), created
with mode 0600 so only the sidecar's own user (and root) can read it, and later
starts read the same file, so clients keep working across restarts. A file
found there that others may read, or that another user owns (not root, not the
sidecar's own: whoever wrote it knows the token), is used with a warning.

Clients on the node (`sidecar stats`, the warm-up job) find it the same way:
SIDECAR_ADMIN_TOKEN, else the file named by SIDECAR_ADMIN_TOKEN_FILE (or a
flag), else the default file under SIDECAR_CACHE_DIR.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from sidecar.config.loading import TOKEN_FILE_NAME
from sidecar.errors import ConfigError

log = logging.getLogger(__name__)

ENV_TOKEN = "SIDECAR_ADMIN_TOKEN"
ENV_TOKEN_FILE = "SIDECAR_ADMIN_TOKEN_FILE"
ENV_CACHE_DIR = "SIDECAR_CACHE_DIR"
# 32 random bytes (256 bits), URL-safe base64: fits a header without quoting.
TOKEN_BYTES = 32
# A token file is a line of text; anything much longer is not one.
MAX_TOKEN_FILE_BYTES = 4096


def default_token_file(cache_dir: Path) -> Path:
    return cache_dir / TOKEN_FILE_NAME


def read_token_file(path: Path) -> str:
    """The token in `path` (surrounding whitespace dropped). ConfigError when the
    file cannot be read, is empty or is not one line of printable ASCII."""
    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_TOKEN_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the admin token file {path}: {exc.strerror}") from None
    token = raw.decode("ascii", errors="replace").strip()
    if len(raw) > MAX_TOKEN_FILE_BYTES or not _one_token(token):
        raise ConfigError(f"the admin token file {path} does not hold one token "
                          "(a single line of printable ASCII without spaces)")
    return token


def _one_token(token: str) -> bool:
    return bool(token) and token.isprintable() and token.isascii() and " " not in token


def ensure_token_file(path: Path, own_uid: int | None = None) -> tuple[str, bool]:
    """The token kept in `path`, generated there (mode 0600) when the file does
    not exist yet; and whether it was generated now. `own_uid`: the user the
    sidecar runs as (default: the effective uid), who may own the file beside
    root. Blocking: call it from an executor once the loop runs."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    try:
        # O_EXCL: two sidecars started at once on one cache dir agree on one token
        # (the loser reads the winner's); 0o600 from the first byte, never chmod later.
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        _warn_if_others_may_know_it(path, os.geteuid() if own_uid is None else own_uid)
        return read_token_file(path), False
    except OSError as exc:
        raise ConfigError(f"cannot create the admin token file {path}: {exc.strerror}") from None
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        handle.write(token + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    return token, True


def _warn_if_others_may_know_it(path: Path, own_uid: int) -> None:
    try:
        found = path.stat()
    except OSError:
        return  # reading it reports the problem
    if found.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the admin token file %s may be read by other users (mode %o): "
                    "chmod 600 it", path, stat.S_IMODE(found.st_mode))
    if untrusted_owner(found.st_uid, own_uid):
        # A warning, as for the mode: refusing would take the admin port down
        # over a file an operator may have provisioned on purpose.
        log.warning("the admin token file %s is owned by uid %d, neither root nor this "
                    "sidecar's user (uid %d): whoever wrote it knows the token; chown it "
                    "to uid %d, or delete it and restart for a new token",
                    path, found.st_uid, own_uid, own_uid)


def untrusted_owner(owner_uid: int, own_uid: int) -> bool:
    """Whether a token file owned by `owner_uid` may have been written by someone
    other than the sidecar's user `own_uid` or root (uid 0)."""
    return owner_uid not in (0, own_uid)


def client_token(env: Mapping[str, str], token_file: Path | None = None) -> str | None:
    """The token a client on this node sends: SIDECAR_ADMIN_TOKEN, else the file
    given (flag) or named by SIDECAR_ADMIN_TOKEN_FILE, else the default file under
    SIDECAR_CACHE_DIR when that exists; None when there is none to find."""
    if env.get(ENV_TOKEN, "").strip():
        # A Secret mounted as a variable often ends in a newline, as the
        # server's own reading allows; the value is never echoed back.
        token = env[ENV_TOKEN].strip()
        if not _one_token(token):
            raise ConfigError(f"{ENV_TOKEN} does not hold one token "
                              "(a single line of printable ASCII without spaces)")
        return token
    if token_file is None and env.get(ENV_TOKEN_FILE):
        token_file = Path(env[ENV_TOKEN_FILE])
    if token_file is not None:
        return read_token_file(token_file)
    if env.get(ENV_CACHE_DIR):
        default = default_token_file(Path(env[ENV_CACHE_DIR]))
        if default.exists():
            return read_token_file(default)
    return None
