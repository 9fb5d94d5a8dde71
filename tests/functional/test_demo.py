"""`sidecar demo` (what `make run` runs): genuine segments readable through the sidecar."""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import sys
import threading

from sidecar.tools.kafka_segments import iter_segment_batches
from tests.functional.conftest import s3_client


def test_demo_serves_genuine_segments_through_the_sidecar() -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "sidecar", "demo", "--listen", "127.0.0.1:0",
         "--admin-listen", "127.0.0.1:0", "--seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        env={**os.environ, "SIDECAR_LOG_LEVEL": "WARNING"},
    )
    lines: queue.Queue[str] = queue.Queue()
    assert process.stdout is not None
    pump = threading.Thread(target=lambda: [lines.put(line) for line in process.stdout],  # type: ignore[union-attr]
                            daemon=True)
    pump.start()
    try:
        banner = ""
        while "Ctrl-C" not in banner:
            banner += lines.get(timeout=90)
        endpoint = re.search(r"sidecar S3 endpoint:\s+(\S+)", banner)
        key = re.search(r"--key (\S+) --range", banner)
        assert endpoint and key, banner
        client = s3_client(endpoint.group(1))
        body = client.get_object(Bucket="tiered", Key=key.group(1))["Body"].read()
        batches = list(iter_segment_batches(body))  # every CRC checked
        assert batches[0].base_offset == 0 and len(body) > 8 * 1024 * 1024
        first_mib = client.get_object(Bucket="tiered", Key=key.group(1), Range="bytes=0-1048575")
        assert first_mib["Body"].read() == body[:1048576]
    finally:
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
        pump.join(timeout=10)
        process.stdout.close()
