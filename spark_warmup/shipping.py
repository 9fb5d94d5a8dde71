"""Ship a job's code to the executors: one zip, handed to SparkContext.addPyFile.

The zip holds `spark_warmup/` and the pure sidecar modules the job's executor
side imports (the warm-up job: `sidecar/layout.py`, `sidecar/blocks.py`,
`sidecar/bucket_names.py`; the capacity analysis: the eviction policy and the
read-ahead planner too) with
their packages' own `__init__` files, which load nothing on import
(tests/unit/test_pure_imports.py), so executors need only PySpark, boto3 and
the standard library, not the sidecar's own dependencies. It is built at run time
from the files this process imported (so it always matches the driver's
code), once per Spark application.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from pyspark.sql import SparkSession

import sidecar.blocks
import sidecar.bucket_names
import sidecar.layout
import spark_warmup


@dataclass(frozen=True)
class Shipment:
    """What one job sends its executors."""

    zip_name: str
    sidecar_modules: tuple[ModuleType, ...]  # pure ones only: shipped without their deps

    def package_inits(self) -> list[str]:
        """The `__init__.py` of every package above the shipped sidecar modules."""
        packages = {".".join(module.__name__.split(".")[:depth])
                    for module in self.sidecar_modules
                    for depth in range(1, module.__name__.count(".") + 1)}
        return sorted(package.replace(".", "/") + "/__init__.py" for package in packages)


WARMUP = Shipment("spark_warmup_job.zip",
                  (sidecar.layout, sidecar.blocks, sidecar.bucket_names))
ZIP_NAME = WARMUP.zip_name
_shipped: dict[tuple[str, str], str] = {}  # (application id, zip name) -> zip path


def build_zip(directory: Path, shipment: Shipment = WARMUP) -> Path:
    """Write the job's zip into `directory`; returns its path."""
    package = Path(spark_warmup.__file__).parent
    root = package.parent
    target = directory / shipment.zip_name
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(package.rglob("*.py")):
            archive.write(source, str(source.relative_to(root)))
        for init in shipment.package_inits():
            archive.write(root / init, init)
        for module in shipment.sidecar_modules:
            source = Path(module.__file__ or "")
            archive.write(source, str(source.relative_to(root)))
    return target


def ship(spark: SparkSession, shipment: Shipment = WARMUP) -> str:
    """Add the job's zip to the session's executors (once per application); its path."""
    context = spark.sparkContext
    shipped = (context.applicationId, shipment.zip_name)
    if shipped in _shipped:
        return _shipped[shipped]
    directory = Path(tempfile.mkdtemp(prefix="spark-warmup-"))
    # Spark serves the file from this path for as long as the application
    # runs; the directory goes when the driver process does.
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = str(build_zip(directory, shipment))
    context.addPyFile(path)
    _shipped[shipped] = path
    return path


def ship_package(spark: SparkSession) -> str:
    """The warm-up job's zip on the session's executors; its path."""
    return ship(spark, WARMUP)
