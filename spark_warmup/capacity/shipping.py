"""Ship the analysis to the executors: one zip, handed to SparkContext.addPyFile.

As the warm-up job's zip (spark_warmup.shipping), built at run time from the
files this process imported: `spark_warmup/` with this package, and the pure
sidecar modules the replay imports (the store's eviction policy, the read-ahead
planner and what they import) under bare package `__init__` files, so
executors need only PySpark and boto3, not the sidecar's own dependencies.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

import sidecar.blocks
import sidecar.cache.errors
import sidecar.cache.ident
import sidecar.cache.slot_fifo
import sidecar.layout
import sidecar.model
import sidecar.prefetch.planner
import sidecar.prefetch.streams
import spark_warmup

ZIP_NAME = "spark_warmup_capacity.zip"
PURE_MODULES = (sidecar.blocks, sidecar.layout, sidecar.model, sidecar.cache.errors,
                sidecar.cache.ident, sidecar.cache.slot_fifo, sidecar.prefetch.planner,
                sidecar.prefetch.streams)
_INIT = '"""The pure sidecar modules the capacity analysis replays with (shipped)."""\n'
_shipped: dict[str, str] = {}  # application id -> zip path


def build_zip(directory: Path) -> Path:
    package = Path(spark_warmup.__file__).parent
    root = package.parent
    target = directory / ZIP_NAME
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(package.rglob("*.py")):
            archive.write(source, str(source.relative_to(root)))
        for init in ("sidecar/__init__.py", "sidecar/cache/__init__.py",
                     "sidecar/prefetch/__init__.py"):
            archive.writestr(init, _INIT)
        for module in PURE_MODULES:
            source = Path(module.__file__ or "")
            archive.write(source, str(source.relative_to(root)))
    return target


def ship_capacity(spark: SparkSession) -> str:
    """Add the zip to the session's executors (once per application); its path."""
    context = spark.sparkContext
    application = context.applicationId
    if application in _shipped:
        return _shipped[application]
    directory = Path(tempfile.mkdtemp(prefix="spark-capacity-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = str(build_zip(directory))
    context.addPyFile(path)
    _shipped[application] = path
    return path
