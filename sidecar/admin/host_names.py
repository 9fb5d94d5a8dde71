"""Which Host header a loopback admin port serves its tokenless pages under.

On loopback, /metrics, /ui and /api/v1/stats need no token: only the node's own
users reach the port. A web page in an operator's browser reaches it too, by DNS
rebinding: its own host name, re-resolved to 127.0.0.1, makes the port
same-origin to the page, which then reads what it answers. The browser still
sends the page's host name in Host (RFC 9110 section 7.2), so a port that
answers only to loopback names is out of the page's reach. Pure: no I/O.
"""

from __future__ import annotations

import ipaddress


def _split_authority(field: str) -> tuple[str, bool] | None:
    """`host[:port]` (RFC 9110 section 7.2, RFC 3986 section 3.2.2) -> (host,
    bracketed), or None when it is not of that form."""
    text = field.strip()
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        host, rest, bracketed = text[1:end], text[end + 1:], True
    else:
        host, sep, port = text.partition(":")
        rest, bracketed = sep + port, False
    if rest and not (rest.startswith(":") and rest[1:].isascii() and rest[1:].isdigit()):
        return None
    return host.lower(), bracketed


def names_loopback(field: str | None, configured_host: str = "") -> bool:
    """Whether a Host field names loopback: an address in 127.0.0.0/8, [::1],
    localhost, or the admin port's configured host; any port, or none. No Host at
    all (HTTP/1.0) is let through: a browser always sends one."""
    if field is None:
        return True
    split = _split_authority(field)
    if split is None:
        return False
    host, bracketed = split
    if host == "localhost" or (configured_host and host == configured_host.lower()):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    # An IPv6 address is written in brackets, an IPv4 one never is.
    return address.is_loopback and bracketed == (address.version == 6)
