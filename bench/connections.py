"""How many TCP connections clients opened to a loopback port, seen from /proc.

The sidecar's access log does not say which connection a request came over, so
the connections a broker's remote storage manager opened to its endpoint are
counted from the kernel's table of TCP sockets instead: /proc/net/tcp and
/proc/net/tcp6 (proc(5)), one line per socket, `local_address` and
`rem_address` as hex `IP:PORT`, `st` the state (01 ESTABLISHED). The server's
side of each connection has the port as its local port; the distinct remote
ports seen while sampling are the connections. Sampled every 100 ms in a
thread, so a connection opened and closed between two samples is missed: a
count of at least this many, exact for pooled keep-alive connections.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

SAMPLE_INTERVAL_S = 0.1
_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_ESTABLISHED = "01"


def client_ports(port: int, tables: tuple[Path, ...] = _TABLES) -> set[int]:
    """The remote ports of the established connections whose local port is `port`."""
    found = set()
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _ESTABLISHED:
                continue
            local, remote = fields[1], fields[2]
            if int(local.rpartition(":")[2], 16) == port:
                found.add(int(remote.rpartition(":")[2], 16))
    return found


class ConnectionSampler:
    """`with ConnectionSampler(port) as seen:` ... `seen.count`: the distinct client
    connections to `port` seen meanwhile."""

    def __init__(self, port: int, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.port = port
        self.interval_s = interval_s
        self.seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"connections-{port}",
                                        daemon=True)

    @property
    def count(self) -> int:
        return len(self.seen)

    def __enter__(self) -> ConnectionSampler:
        self.seen |= client_ports(self.port)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.seen |= client_ports(self.port)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.seen |= client_ports(self.port)
