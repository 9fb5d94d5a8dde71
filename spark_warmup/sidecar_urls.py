"""A sidecar's admin URL, checked before the job sends it the admin token.

The URL comes from the plan, or from a template filled with host names the
Kafka cluster's metadata gives (`kafka.sidecar_url`), which the job does not
control: a broker advertising the host `evil#` or `x@attacker` would otherwise
move the target (RFC 3986 section 3: `#` starts the fragment, `@` ends the
userinfo, `/`, `?` start the path and the query). So a sidecar URL is only
`http(s)://HOST[:PORT]`: a DNS name or an IP literal, a decimal port, and
nothing else (no userinfo, path, query or fragment).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

SCHEMES = ("http", "https")
# RFC 1123 host names: letters, digits and hyphens in dot-separated labels of at
# most 63 characters (underscores are tolerated, as some internal DNS has them).
_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")
_MAX_HOST = 253


class SidecarUrlError(ValueError):
    """Not a URL the job sends a sidecar's admin token to; the message says why."""


def check_sidecar_url(value: object) -> str:
    """`value` as `scheme://host[:port]` (lower-case scheme, no trailing slash), or
    SidecarUrlError."""
    if not isinstance(value, str):
        raise SidecarUrlError(f"must be an http(s) URL string, got {type(value).__name__}")
    if not value.isascii() or not value.isprintable() or any(c.isspace() for c in value):
        raise SidecarUrlError(f"must be printable ASCII without spaces, got {value!r}")
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise SidecarUrlError(f"must be an http(s) URL, got {value!r}")
    authority, _, path = rest.partition("/")
    for mark, what in (("?", "a query"), ("#", "a fragment"), ("@", "a user name")):
        if mark in authority:
            raise SidecarUrlError(f"must not carry {what} ({mark!r}) in {value!r}")
    if path:
        raise SidecarUrlError(f"must not have a path, got {value!r}: the job adds /api/v1/...")
    host, port = _split_port(authority, value)
    _check_host(host, value)
    # Sanity: the standard library reads the same host and port from what we return.
    parts = urlsplit(f"{scheme.lower()}://{authority}")
    if parts.hostname is None or parts.port != port:
        raise SidecarUrlError(f"cannot be read unambiguously: {value!r}")
    return f"{scheme.lower()}://{authority}"


def _split_port(authority: str, value: str) -> tuple[str, int | None]:
    if authority.startswith("["):
        host, bracket, after = authority[1:].partition("]")
        if not bracket or (after and not after.startswith(":")):
            raise SidecarUrlError(f"a bracketed IPv6 host must be [ADDRESS][:PORT]: {value!r}")
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise SidecarUrlError(f"{host!r} is not an IPv6 address in {value!r}") from None
        port_text = after[1:] if after else None
        return f"[{host}]", _port(port_text, value)
    host, colon, port_text = authority.partition(":")
    return host, _port(port_text if colon else None, value)


def _port(text: str | None, value: str) -> int | None:
    if text is None:
        return None
    # ASCII digits only: str.isdigit() also takes '²' and other scripts' digits.
    if not text or not text.isascii() or not text.isdigit() or len(text) > 5 \
            or not 0 < int(text) < 65536:
        raise SidecarUrlError(f"the port must be a number from 1 to 65535 in {value!r}")
    return int(text)


def _check_host(host: str, value: str) -> None:
    if host.startswith("["):
        return  # checked as an IPv6 address
    if not host:
        raise SidecarUrlError(f"has no host: {value!r}")
    if len(host) > _MAX_HOST or not all(_LABEL.fullmatch(label)
                                        for label in host.rstrip(".").split(".")):
        raise SidecarUrlError(f"{host!r} is not a host name or address in {value!r}")
