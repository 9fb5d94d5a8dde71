"""The warm-up job's peek at a segment's first record batch (its times, for a
time-range selection), against an object store that ignores Range: the proxy
in front of moto answers the whole segment and then stalls, as a slow store
streaming a gigabyte would."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sidecar.tools.kafka_segments import build_segment, iter_segment_batches
from spark_warmup.listing import _with_times
from spark_warmup.selection import Segment
from tests.support.fault_proxy import Fault, FaultProxy
from tests.support.s3_clients import s3_client

KEY = "orders-AAAAAAAAAAAAAAAAAAAAAA/0/00000000000000000000-BBBBBBBBBBBBBBBBBBBBBB.log"
# Long enough for the whole wait of a reader that takes everything.
STALL_S = 120.0


def test_the_first_batchs_times_come_without_reading_a_whole_segment(
    origin_s3: Any, bucket: str, fault_proxy: FaultProxy
) -> None:
    data, _ = build_segment(0, target_bytes=1_000_000, records_per_batch=20, value_size=100,
                            base_timestamp_ms=1_790_000_000_500, seed=5, timestamp_step_ms=1)
    origin_s3.put_object(Bucket=bucket, Key=KEY, Body=data)
    first = next(iter_segment_batches(data))
    fault_proxy.add(Fault("ignore_range", after_bytes=64 * 1024, seconds=STALL_S), "GET", KEY)
    segment = Segment("orders", 0, KEY, len(data), 0)
    try:
        with ThreadPoolExecutor(max_workers=1) as pool:
            peeked = pool.submit(_with_times, s3_client(fault_proxy.endpoint), bucket, segment)
            # Before the stall ends: the header was read, the rest left unread.
            timed = peeked.result(timeout=STALL_S / 2)
    finally:
        fault_proxy.clear()  # ends the stall, whatever happened
    assert (timed.base_timestamp, timed.max_timestamp) == \
        (first.base_timestamp, first.max_timestamp)
    assert fault_proxy.requests("GET", KEY)[0].fault == "ignore_range"
