"""`sidecar serve` runs on what `pip install .` installs, and nothing more.

The developer tools (demo, replay, the Kafka segment builder) and Spark are
extras; a broker node must not carry moto, boto3, kafka-python or pyspark. These
tests load the serving path in a clean interpreter and look at what it imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Top-level packages that only the tools, Spark or the tests may bring in.
NOT_ON_A_BROKER = ("moto", "boto3", "kafka", "pyspark", "crc32c", "flask", "spark_warmup")


def _imported_by(statement: str) -> set[str]:
    script = (
        f"import sys; {statement}; import json; "
        "print(json.dumps(sorted({name.split('.')[0] for name in sys.modules} "
        "| {name for name in sys.modules if name.startswith('sidecar.')})))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    return set(json.loads(result.stdout))


def test_the_serving_path_imports_no_tool_and_no_spark() -> None:
    imported = _imported_by(
        "import sidecar.cli, sidecar.server; "
        "sidecar.cli.build_parser().parse_args(['serve', '--cache-dir', '/tmp'])"
    )
    assert "sidecar.server" in imported and "aiobotocore" in imported  # it did load
    assert not imported & set(NOT_ON_A_BROKER), sorted(imported & set(NOT_ON_A_BROKER))
    assert not {name for name in imported if name.startswith("sidecar.tools")}


def test_the_runtime_dependencies_leave_the_tools_to_extras() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    runtime = {requirement.split(">")[0].split("[")[0].split("=")[0].strip().lower()
               for requirement in project["dependencies"]}
    assert not runtime & {"moto", "boto3", "kafka-python", "pyspark", "crc32c"}, runtime
    tools = " ".join(project["optional-dependencies"]["tools"])
    assert all(name in tools for name in ("moto", "boto3", "kafka-python"))


def test_demo_without_the_tools_extra_says_what_to_install() -> None:
    # moto hidden: what a `pip install .` node sees when someone runs the demo.
    script = (
        "import sys; sys.modules['moto'] = None; sys.modules['kafka'] = None; "
        "from sidecar.cli import main; sys.exit(main(['demo']))"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            cwd=ROOT, check=False, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "sidecar: error: `sidecar demo` needs the tools extra (kafka is not installed): in "
        "the sidecar's checkout, pip install '.[tools]'")


@pytest.mark.parametrize("module", ["spark_warmup", "spark_warmup.capacity"])
def test_a_spark_job_without_the_spark_extra_says_what_to_install(module: str) -> None:
    # pyspark hidden: what a `pip install .` node sees when someone runs a job.
    script = ("import sys, runpy; sys.modules['pyspark'] = None; "
              f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")
    result = subprocess.run([sys.executable, "-c", script, "plan.json"], capture_output=True,
                            text=True, cwd=ROOT, check=False, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"{module}: error: `python -m {module}` needs the spark extra (pyspark is not "
        "installed): in the sidecar's checkout, pip install '.[spark]'")
