"""How executors talk HTTP to sidecars: the standard library's urllib, with
redirects refused and TLS verified against the plan's CA file.

A warm call carries the admin token. urllib follows a 3xx by default and sends
the request's headers along (Authorization included) to wherever `Location`
points; here a redirect is an answer like any other non-2xx, so the token only
ever goes to the URL the plan named. For an `https://` sidecar (behind a TLS
proxy) the certificate is checked against `ca_file` (PEM) when the plan gives
one, else against the system's CAs; host names are always checked.
"""

from __future__ import annotations

import http.client
import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from email.message import Message
from typing import IO

from spark_warmup.units import shorten

# (url, body, headers, timeout_s) -> (status, body); raises OSError on the network
# (NoHttpAnswer for what is not HTTP).
# The body is cut at ANSWER_BYTES + 1 bytes.
Post = Callable[[str, bytes, Mapping[str, str], float], tuple[int, bytes]]


# A warm answer is a few counts and an error a line: more is not a sidecar's
# answer (a misrouted URL, a proxy streaming something else), and reading it all
# would hold an executor's memory and time. One byte more says it was cut.
ANSWER_BYTES = 1024 * 1024


class NoHttpAnswer(ConnectionError):
    """What the URL answered is no HTTP (a TLS port called with http://, another
    service's banner) or broke off mid-answer. http.client says so with an
    HTTPException, which is no OSError: every caller here counts it as a
    sidecar that did not answer, not as a crash of the task or the driver."""


@contextmanager
def http_answers() -> Iterator[None]:
    """Turns http.client's HTTPException into NoHttpAnswer (an OSError)."""
    try:
        yield
    except http.client.HTTPException as exc:
        said = str(exc)
        # A TLS record starts with its type: 0x15 an alert, 0x16 a handshake.
        hint = "; a TLS port? use https://" if said[:1] in ("\x15", "\x16") else ""
        raise NoHttpAnswer(f"no HTTP answer ({type(exc).__name__}: "
                           f"{shorten(said, 40)!r}){hint}") from None


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req: urllib.request.Request, fp: IO[bytes], code: int,
                         msg: str, headers: Message, newurl: str) -> None:
        # None: urllib raises HTTPError with the 3xx itself, which callers report.
        return None


def opener(ca_file: str | None) -> urllib.request.OpenerDirector:
    """An opener that follows no redirect and verifies TLS against `ca_file`
    (None: the system's CAs). ssl errors (a missing or bad CA file) are OSErrors."""
    context = ssl.create_default_context(cafile=ca_file)
    return urllib.request.build_opener(_NoRedirects(),
                                       urllib.request.HTTPSHandler(context=context))


def poster(ca_file: str | None) -> Post:
    """A Post over `opener(ca_file)`: a 2xx or an error status is an answer."""
    director = opener(ca_file)

    def post(url: str, body: bytes, headers: Mapping[str, str], timeout: float
             ) -> tuple[int, bytes]:
        request = urllib.request.Request(url, data=body, headers=dict(headers), method="POST")
        with http_answers():
            try:
                with director.open(request, timeout=timeout) as response:
                    return int(response.status), bytes(response.read(ANSWER_BYTES + 1))
            except urllib.error.HTTPError as exc:  # an answer, a redirect too, just not a 2xx
                with exc:
                    return exc.code, exc.read(ANSWER_BYTES + 1)
    return post
