"""The memory tier in a real sidecar process: a slow reader's bytes never change.

The kernel keeps references to the pages sendfile handed a socket until the
peer has read them. A reader with a tiny receive buffer leaves a whole
response queued in the sockets (the sidecar's send queue, its own receive
queue) while other clients' reads make the tier evict and refill every one of
its regions many times over: every byte the slow reader then receives must be
the original's, which holds only because an evicted region's pages are
punched out before it is filled again (sidecar.cache.memory_tier).
"""

from __future__ import annotations

import json
import random
import socket
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from sidecar.tools.local_s3 import LocalS3
from tests.support.processes import SidecarProcess
from tests.support.waiting import eventually

MiB = 1024 * 1024
TIER = 4 * MiB  # four regions of one 1 MiB chunk
OBJECT = 2 * MiB
OTHERS = 10  # 20 MiB through a 4 MiB tier: each region refilled four or five times
RECEIVE_BUFFER = 4096
HANG_UPS = 12


@pytest.fixture()
def tiered_sidecar(local_s3: LocalS3, tmp_path: Path) -> Iterator[SidecarProcess]:
    cache = tmp_path / "cache"
    cache.mkdir()
    with SidecarProcess(
        local_s3.endpoint, cache, "--block-size", "1MiB", "--cache-size", "64MiB",
        # No recent-chunk memory: a block read again is read back from the slab
        # (past the page cache), which is the second offer a full tier admits.
        env={"SIDECAR_PREFETCH": "false", "SIDECAR_MEMORY_TIER": str(TIER),
             "SIDECAR_RECENT_CHUNKS": "0"},
    ) as process:
        yield process


def queued_bytes(server_port: int, client_port: int) -> int:
    """Bytes of the connection in the kernel: the sidecar's socket's send queue
    and the reader's receive queue (/proc/net/tcp, hex tx_queue:rx_queue)."""
    total = 0
    with open("/proc/net/tcp") as table:
        next(table)
        for line in table:
            fields = line.split()
            local, remote = (int(address.split(":")[1], 16) for address in fields[1:3])
            tx_queue, rx_queue = (int(value, 16) for value in fields[4].split(":"))
            if (local, remote) == (server_port, client_port):
                total += tx_queue
            elif (local, remote) == (client_port, server_port):
                total += rx_queue
    return total


def test_the_tiers_memory_is_taken_at_start(tiered_sidecar: SidecarProcess) -> None:
    eventually(lambda: tiered_sidecar.metric("sidecar_memory_tier_resident_bytes") == TIER,
               "the tier's memory taken at start (memory_tier_reserve)")
    assert tiered_sidecar.metric("sidecar_memory_tier_used_bytes") == 0


def test_a_slow_reader_receives_the_original_bytes_while_the_tier_refills_its_regions(
        tiered_sidecar: SidecarProcess, origin_s3: Any, bucket: str) -> None:
    rng = random.Random(31)
    original = rng.randbytes(OBJECT)
    origin_s3.put_object(Bucket=bucket, Key="slow", Body=original)
    others = {f"other-{i}": rng.randbytes(OBJECT) for i in range(OTHERS)}
    for key, body in others.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=body)
    address = urlsplit(tiered_sidecar.data_url)
    assert address.hostname is not None and address.port is not None

    reader = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)
    reader.settimeout(30)
    try:
        reader.connect((address.hostname, address.port))
        # A bounded range, as the broker's plugin asks for a chunk: the sidecar
        # leaves the socket's send buffer to the kernel (an open-ended read
        # would get a small one).
        reader.sendall(f"GET /{bucket}/slow HTTP/1.1\r\nHost: {address.netloc}\r\n"
                       f"Range: bytes=0-{OBJECT - 1}\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += reader.recv(256)
        head, received = head.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 206"), head
        assert f"content-length: {OBJECT}".encode() in head.lower()
        # The whole response leaves the tier before anything else happens:
        # every byte of it is in the kernel, none read by the reader yet.
        client_port = reader.getsockname()[1]
        eventually(lambda: queued_bytes(address.port, client_port) + len(received) >= OBJECT,
                   "the whole response to be queued in the sockets")
        # Every piece of it was sent from the tier (each chunk as it landed).
        assert tiered_sidecar.metric("sidecar_memory_tier_hits_total") == OBJECT // MiB

        for number, (key, body) in enumerate(others.items(), 2):
            # Three times: declined as it lands in the full tier and at its
            # first read back, admitted at the second.
            for _ in range(3):
                with urllib.request.urlopen(f"{tiered_sidecar.data_url}/{bucket}/{key}",
                                            timeout=30) as response:
                    assert response.read() == body
                # Cached before it is read again (the slow answer keeps the
                # sidecar from ever being idle: its blocks are counted instead).
                blocks = number * OBJECT // MiB
                eventually(lambda blocks=blocks: tiered_sidecar.metric(
                    "sidecar_cache_blocks") >= blocks, f"{blocks} blocks cached")

        # Every region was evicted and refilled several times meanwhile.
        evictions = tiered_sidecar.metric("sidecar_memory_tier_evictions_total")
        assert evictions >= (OTHERS * OBJECT) // MiB - TIER // MiB + OBJECT // MiB
        assert tiered_sidecar.metric("sidecar_memory_tier_size_bytes") == TIER
        assert 0 < tiered_sidecar.metric("sidecar_memory_tier_resident_bytes") <= TIER

        body = bytearray(received)
        while len(body) < OBJECT:
            chunk = reader.recv(RECEIVE_BUFFER)
            assert chunk, f"the connection ended after {len(body)} bytes"
            body += chunk
    finally:
        reader.close()
    assert len(body) == OBJECT
    changed = sum(1 for a, b in zip(body, original, strict=True) if a != b)
    assert changed == 0, f"{changed} of the slow reader's bytes are not the original's"
    assert bytes(body) == original


def test_readers_hanging_up_mid_answer_from_the_tier_leave_the_log_quiet(
        tiered_sidecar: SidecarProcess, origin_s3: Any, bucket: str) -> None:
    """Kafka's remote reader closes the stream after each fetch, also when the
    answer comes from the tier with sendfile: counted, never logged."""
    body = random.Random(34).randbytes(OBJECT)
    origin_s3.put_object(Bucket=bucket, Key="hung-up", Body=body)
    with urllib.request.urlopen(f"{tiered_sidecar.data_url}/{bucket}/hung-up",
                                timeout=30) as response:
        assert response.read() == body  # both chunks land in the (empty) tier
    before = len(tiered_sidecar.stderr_lines)
    hits = tiered_sidecar.metric("sidecar_memory_tier_hits_total")
    address = urlsplit(tiered_sidecar.data_url)
    assert address.hostname is not None and address.port is not None
    for _ in range(HANG_UPS):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as reader:
            # A fixed receive buffer: the rest of the answer cannot all fit in
            # the sockets, so every hang-up is one mid-answer.
            reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)
            reader.settimeout(30)
            reader.connect((address.hostname, address.port))
            reader.sendall(f"GET /{bucket}/hung-up HTTP/1.1\r\nHost: {address.netloc}\r\n"
                           "Range: bytes=0-\r\n\r\n".encode())
            # As a fetch does: read the part of the open-ended answer it wants,
            # hang up.
            received = b""
            while len(received) < MiB // 2:
                piece = reader.recv(256 * 1024)
                assert piece, "the answer ended early"
                received += piece
            assert received.startswith(b"HTTP/1.1 206")
    tiered_sidecar.wait_idle()  # every answer over, sent or cut off
    assert tiered_sidecar.stderr_lines[before:] == []
    assert tiered_sidecar.metric("sidecar_client_disconnects_total") == HANG_UPS
    assert tiered_sidecar.metric("sidecar_memory_tier_hits_total") > hits


@pytest.mark.parametrize("on_the_disk", [False, True], ids=["fetched", "on-the-disk"])
def test_a_warmed_object_waits_in_a_full_tier_for_its_reader(
        tiered_sidecar: SidecarProcess, origin_s3: Any, bucket: str, on_the_disk: bool) -> None:
    """Warm-up reaches the tier: the chunks of a warm call land in a full tier
    (a read-ahead's landing would be declined) and stay there, through other
    readers' churn, until the planned replay reads them from memory. An
    object read once before, on the disk and not in the full tier, is read
    from the disk into the tier by the warm call, and waits there as well."""
    rng = random.Random(35)
    warmed = rng.randbytes(OBJECT)
    origin_s3.put_object(Bucket=bucket, Key="warmed", Body=warmed)
    others = {f"churn-{i}": rng.randbytes(OBJECT) for i in range(4)}
    for key, body in others.items():
        origin_s3.put_object(Bucket=bucket, Key=key, Body=body)

    def read_three_times(key: str) -> None:
        # Landed, read back once (declined), read back again (admitted).
        for _ in range(3):
            with urllib.request.urlopen(f"{tiered_sidecar.data_url}/{bucket}/{key}",
                                        timeout=30) as response:
                assert response.read() == others[key]
            tiered_sidecar.wait_idle()

    first, second, *rest = others
    read_three_times(first)
    read_three_times(second)  # the tier's four regions are full
    assert tiered_sidecar.metric("sidecar_memory_tier_used_bytes") == TIER
    if on_the_disk:
        with urllib.request.urlopen(f"{tiered_sidecar.data_url}/{bucket}/warmed",
                                    timeout=30) as response:
            assert response.read() == warmed
        tiered_sidecar.wait_idle()
    inserted = tiered_sidecar.metric("sidecar_memory_tier_inserts_total")
    request = urllib.request.Request(
        f"{tiered_sidecar.admin_url}/api/v1/warm", method="POST",
        data=json.dumps({"objects": [{"bucket": bucket, "key": "warmed"}],
                         "ttl_s": 600}).encode(),
        headers={"Content-Type": "application/json",
                 "Authorization": f"Bearer {tiered_sidecar.admin_token}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        answer = json.load(response)
    assert answer["already_cached" if on_the_disk else "fetched"] == OBJECT // MiB
    assert tiered_sidecar.metric("sidecar_memory_tier_inserts_total") - inserted == \
        OBJECT // MiB
    # What the warm-up holds, as an operator watches it: on the disk and in memory.
    assert tiered_sidecar.metric("sidecar_cache_protected_blocks") == OBJECT // MiB
    assert tiered_sidecar.metric("sidecar_memory_tier_protected_bytes") == OBJECT
    for key in rest:  # two more objects admitted, each pushing two chunks out
        read_three_times(key)
    # The churn alone pushed out as many chunks as the tier has regions.
    assert tiered_sidecar.metric("sidecar_memory_tier_evictions_total") >= TIER // MiB
    hits = tiered_sidecar.metric("sidecar_memory_tier_hits_total")
    with urllib.request.urlopen(f"{tiered_sidecar.data_url}/{bucket}/warmed",
                                timeout=30) as response:
        assert response.read() == warmed
    assert tiered_sidecar.metric("sidecar_memory_tier_hits_total") - hits == OBJECT // MiB
    assert tiered_sidecar.metric("sidecar_cache_protected_blocks") == 0
    assert tiered_sidecar.metric("sidecar_memory_tier_protected_bytes") == 0
