"""Warm the sidecars' caches ahead of a planned replay (`python -m spark_warmup PLAN.json`).

The plan (docs/ARCHITECTURE.md, "Warm-up plan") names the object store, the sidecars or
the Kafka cluster, and the ranges (or consumer groups) to be replayed. A PySpark
job lists the remote segments on the executors, picks the segments that overlap
each range, routes every partition to the sidecar of the broker that serves it
and asks that sidecar (`POST /api/v1/warm`) to fetch the segment into its cache.

Pure modules: `units`, `plan`, `selection`, `groups`, `metadata`, `routing`,
`outcome`. Executor-side I/O: `listing` (S3) and `warming` (sidecar HTTP).
Driver-side I/O: `cluster` (Kafka, kafka-python's admin client). Spark: `job`,
`shipping`, `report`, and `__main__`, the only place a session is built. Of
`sidecar/` only the pure `layout` and `blocks` are imported, so the package
ships to a cluster as one small zip.
"""
