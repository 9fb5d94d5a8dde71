"""Write the run's report under `--report DIR`: `report.jsonl`, `report.parquet/`, `summary.json`.

The JSON lines and the summary are written by the driver; the Parquet copy by
Spark itself (one file), so DIR must be a path the executors can write too: a
local directory for `local[*]` or a single-machine cluster, a shared mount
otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import astuple
from pathlib import Path

from py4j.protocol import Py4JError, Py4JJavaError
from pyspark.sql import SparkSession
from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

from spark_warmup.outcome import Summary, WarmRow

REPORT_SCHEMA = StructType([
    StructField("topic", StringType(), False),
    StructField("partition", IntegerType(), False),
    StructField("key", StringType(), False),
    StructField("node", StringType(), False),
    StructField("bytes", LongType(), False),
    StructField("blocks", LongType(), False),
    StructField("already_cached", LongType(), False),
    StructField("fetched", LongType(), False),
    StructField("failed", LongType(), False),
    StructField("bytes_fetched", LongType(), False),
    StructField("seconds", DoubleType(), False),
    StructField("error", StringType(), True),
])


def write_report(spark: SparkSession, rows: Sequence[WarmRow], summary: Summary,
                 directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with (directory / "report.jsonl").open("w", encoding="utf-8") as lines:
        for row in rows:
            lines.write(json.dumps(row.as_dict()) + "\n")
    (directory / "summary.json").write_text(
        json.dumps(summary.as_dict(), indent=2) + "\n", encoding="utf-8"
    )
    frame = spark.createDataFrame([astuple(row) for row in rows], REPORT_SCHEMA)
    # A file: path, so a cluster whose default file system is HDFS writes here too.
    # Not Path.as_uri(): Hadoop's Path takes what follows "file://" as the path
    # itself, so the %20 of a space (%25 of a '%') would name another directory.
    target = "file://" + str(directory.resolve() / "report.parquet")
    frame.coalesce(1).write.mode("overwrite").parquet(target)


def spark_reason(java_text: str) -> str:
    """A Java exception as py4j prints it (its stack trace follows) -> one short line."""
    first = (java_text.strip().splitlines() or ["failed"])[0]
    return "Spark: " + (first if len(first) <= 300 else first[:300] + "...")


def spark_failure(exc: Py4JJavaError) -> str:
    """One short line for a failed Spark call: its deepest cause (a file that
    could not be created), not the job abort wrapped around it, which would
    fill the line before the reason."""
    cause = exc.java_exception
    try:
        while (deeper := cause.getCause()) is not None:
            cause = deeper
    except Py4JError:  # the JVM is gone: what the exception itself says
        pass
    return spark_reason(str(cause))
