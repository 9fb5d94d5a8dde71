"""Ship the job's code to the executors: one zip, handed to SparkContext.addPyFile.

The zip holds `spark_warmup/` and the pure sidecar modules it imports
(`sidecar/layout.py`, `sidecar/blocks.py`) under a bare `sidecar/__init__.py`,
so executors need only PySpark, boto3 and the standard library, not the
sidecar's own dependencies. It is built at run time from the files this
process imported (so it always matches the driver's code), once per Spark
application.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import zipfile
from pathlib import Path

from pyspark.sql import SparkSession

import sidecar.blocks
import sidecar.layout
import spark_warmup

ZIP_NAME = "spark_warmup_job.zip"
_SIDECAR_INIT = '"""The pure sidecar modules the warm-up job uses (shipped by spark_warmup)."""\n'
_shipped: dict[str, str] = {}  # application id -> zip path


def build_zip(directory: Path) -> Path:
    """Write the job's zip into `directory`; returns its path."""
    package = Path(spark_warmup.__file__).parent
    target = directory / ZIP_NAME
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(package.glob("*.py")):
            archive.write(source, f"spark_warmup/{source.name}")
        archive.writestr("sidecar/__init__.py", _SIDECAR_INIT)
        for module in (sidecar.layout, sidecar.blocks):
            source = Path(module.__file__ or "")
            archive.write(source, f"sidecar/{source.name}")
    return target


def ship_package(spark: SparkSession) -> str:
    """Add the job's zip to the session's executors (once per application); its path."""
    context = spark.sparkContext
    application = context.applicationId
    if application in _shipped:
        return _shipped[application]
    directory = Path(tempfile.mkdtemp(prefix="spark-warmup-"))
    # Spark serves the file from this path for as long as the application
    # runs; the directory goes when the driver process does.
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    path = str(build_zip(directory))
    context.addPyFile(path)
    _shipped[application] = path
    return path
