"""What the capacity analysis ships to its executors (spark_warmup.shipping):
`spark_warmup/` and the pure sidecar modules the replay imports, the store's
eviction policy, the read-ahead planner and what they import; and the warm-up
job's, which spark_warmup.shipping imports, and with it this module and the
job's functions as the executors unpickle them."""

from __future__ import annotations

from pyspark.sql import SparkSession

import sidecar.blocks
import sidecar.bucket_names
import sidecar.cache.errors
import sidecar.cache.ident
import sidecar.cache.slot_fifo
import sidecar.layout
import sidecar.model
import sidecar.prefetch.planner
import sidecar.prefetch.streams
from spark_warmup.shipping import Shipment, ship

CAPACITY = Shipment(
    "spark_warmup_capacity.zip",
    (sidecar.blocks, sidecar.bucket_names, sidecar.layout, sidecar.model, sidecar.cache.errors,
     sidecar.cache.ident, sidecar.cache.slot_fifo, sidecar.prefetch.planner,
     sidecar.prefetch.streams),
)


def ship_capacity(spark: SparkSession) -> str:
    """The capacity analysis's zip on the session's executors; its path."""
    return ship(spark, CAPACITY)
