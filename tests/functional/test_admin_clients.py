"""`sidecar stats|mode|purge` pointed at something that is not a sidecar's admin
port, or at one that refuses: one short line on stderr and exit 2, never a
traceback, never the other server's page dumped into the terminal.

The other end is a real HTTP server on loopback answering as a proxy, a web
server or another service would; the command runs as the operator runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

# A page as a reverse proxy or web server sends it: many lines, a few KiB.
HTML_PAGE = (b"<html><head><title>502 Bad Gateway</title></head>\n<body>\n"
             b"<h1>Bad Gateway</h1>\n" + b"<p>upstream error</p>\n" * 200 + b"</body></html>\n")


class _Answers(BaseHTTPRequestHandler):
    """Answers every method with the status and body the test put on the server."""

    def _answer(self) -> None:
        status, content_type, body = self.server.answer  # type: ignore[attr-defined]
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_PUT = do_DELETE = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def other_server() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def run_client(server: ThreadingHTTPServer, *args: str) -> subprocess.CompletedProcess[str]:
    port = server.server_address[1]
    return subprocess.run(
        [sys.executable, "-m", "sidecar", *args, "--admin", f"127.0.0.1:{port}"],
        capture_output=True, text=True, timeout=30,
        env={**os.environ, "SIDECAR_ADMIN_TOKEN": "t0ken"},
    )


COMMANDS = [["stats"], ["mode", "bypass"], ["purge", "tiered", "a key/ü.log"]]


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize(
    "answer",
    [(200, "application/json", b"{}"), (200, "application/json", b"[1, 2]"),
     (200, "application/json", b"null")],
    ids=["empty object", "list", "null"],
)
def test_json_that_is_not_a_sidecars_answer_is_named(
        other_server: ThreadingHTTPServer, command: list[str],
        answer: tuple[int, str, bytes]) -> None:
    other_server.answer = answer  # type: ignore[attr-defined]
    result = run_client(other_server, *command)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a sidecar's admin answer" in lines[0], result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
@pytest.mark.parametrize("status", [502])
def test_an_error_page_is_one_short_line(other_server: ThreadingHTTPServer, command: list[str],
                                         status: int) -> None:
    other_server.answer = (status, "text/html", HTML_PAGE)  # type: ignore[attr-defined]
    result = run_client(other_server, *command)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and len(lines[0]) < 300, result.stderr
    assert f": {status} " in lines[0] and "text/html" in lines[0], lines[0]


def test_a_sidecars_own_error_is_shown_as_its_message(other_server: ThreadingHTTPServer) -> None:
    """The sidecar answers errors as {"error": ...}: the message, not the JSON."""
    other_server.answer = (  # type: ignore[attr-defined]
        401, "application/json", b'{"error": "missing or wrong admin token"}')
    result = run_client(other_server, "mode", "bypass")
    assert result.returncode == 2
    assert result.stderr.strip().endswith(": 401 missing or wrong admin token"), result.stderr
