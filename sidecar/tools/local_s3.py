"""A local S3 server (moto's server mode) on loopback, in a child process.

The demo and the functional tests use it as the origin. It runs in its own
process so that it does not share the sidecar's interpreter lock: in a real
deployment the object store is on another machine.

`python -m sidecar.tools.local_s3` starts moto on 127.0.0.1 with a free port, prints
`{"endpoint": "http://127.0.0.1:PORT"}` and serves until its stdin closes (so
it never outlives the process that started it) or it gets SIGTERM.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
from types import TracebackType
from typing import Any

# moto accepts any credentials; these keep botocore from looking further.
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "sidecar-demo",
    "AWS_SECRET_ACCESS_KEY": "sidecar-demo-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def loopback_client(endpoint: str, *, key: str | None = None, secret: str | None = None,
                    region: str = "us-east-1", **config: Any) -> Any:
    """A boto3 S3 client for an endpoint on loopback: this moto server, nginx standing in
    for an object store, or a sidecar. Path-style addressing (no bucket host names to
    resolve) and one attempt, so a caller sees the first answer rather than a retry's;
    `config` adds to or overrides botocore's Config. Without `key`, boto3 finds
    credentials as usual (CREDENTIALS when the caller exported them)."""
    import boto3
    from botocore.config import Config

    options: dict[str, Any] = {"s3": {"addressing_style": "path"},
                               "retries": {"max_attempts": 1}, **config}
    return boto3.client("s3", endpoint_url=endpoint, region_name=region,
                        aws_access_key_id=key, aws_secret_access_key=secret,
                        config=Config(**options))


def main() -> None:
    from moto.server import ThreadedMotoServer

    # werkzeug logs every request to stderr; the demo's terminal is for the banner.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer("127.0.0.1", 0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    print(json.dumps({"endpoint": f"http://{host}:{port}"}), flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())

    def wait_for_parent() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=wait_for_parent, daemon=True).start()
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    server.stop()


class LocalS3:
    """Context manager: a moto server child process; `endpoint` once entered."""

    def __init__(self, prefix: tuple[str, ...] = ()) -> None:
        """`prefix`: a command that runs the server, e.g. in another network namespace."""
        self.endpoint = ""
        self._prefix = prefix
        self._process: subprocess.Popen[str] | None = None

    def __enter__(self) -> LocalS3:
        env = {**os.environ, **CREDENTIALS}
        self._process = subprocess.Popen(
            [*self._prefix, sys.executable, "-m", "sidecar.tools.local_s3"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
        )
        assert self._process.stdout is not None
        try:
            line = self._process.stdout.readline()
            if not line:
                self._process.wait(timeout=10)
                raise RuntimeError(f"local S3 server exited with {self._process.returncode}")
            self.endpoint = json.loads(line)["endpoint"]
        except BaseException:
            # Interrupted while it starts (the broker demo's Ctrl-C): it must not outlive
            # this process, nor fail to print its endpoint into a pipe closed under it.
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._process is None:
            return
        assert self._process.stdin is not None
        self._process.stdin.close()
        try:
            self._process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


if __name__ == "__main__":
    main()
