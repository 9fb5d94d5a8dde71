"""A free TCP port on loopback, for the servers the tools, tests and benchmarks start.

The port is free when asked and may be taken before the server binds it; callers
that can (the Kafka broker) retry on "Address already in use".
"""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port
