"""A client's failures while an answer is sent to it, told apart from the
failures of what feeds the answer (the engine, the origin).

asyncio and aiohttp raise the same ConnectionError and TimeoutError for a
client that hung up or took nothing within client_timeout as for an origin
read or an engine fetch that failed the same way. Only the send itself knows
whose it was: wrapped in ``sending_to_client``, its failures become
``ClientGone`` and ``ClientStalled``, and anything else raised around it stays
the feeder's.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class ClientGone(Exception):
    """Sending the answer found the client gone."""


class ClientStalled(Exception):
    """The client took no bytes of a piece within client_timeout."""


@contextmanager
def sending_to_client() -> Iterator[None]:
    """Around a send to the client (prepare, write, write_eof)."""
    try:
        yield
    except TimeoutError as exc:
        raise ClientStalled() from exc
    except ConnectionError as exc:
        raise ClientGone() from exc
