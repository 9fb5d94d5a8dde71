"""Every metric, option and flag deploy/ names is one the sidecar has.

Metrics, with the labels and label values named, are held to one real scrape
of the metrics listener. The dashboard's panels and the recording rules are
also queried against a real Prometheus (test_observability.py), but an alert, a
promtool test series, a matcher such as `mode!="normal"` or a metric quoted in
deploy/README.md that names a series the sidecar does not export fails nowhere
else: the alert stays silent, the unit test tests a series that never comes.

Options written as TOML (`stop_timeout = "20s"`) anywhere in deploy/, and the
`sidecar ...` commands and `--flag VALUE` settings the README gives, are held
to the option table and the command line's own parser, values included: the
ConfigMap and the unit's command are checked by running them
(test_deploy_files.py), the prose an operator copies from was not.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import tomllib
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.cli import build_parser
from sidecar.config import OPTIONS, Option
from sidecar.errors import ConfigError
from sidecar.tools.local_s3 import LocalS3
from tests.support.processes import SidecarProcess

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DASHBOARD = DEPLOY / "grafana" / "sidecar-dashboard.json"

# A metric name where a text names one: not part of a recorded series' name
# (`instance:sidecar_byte_hit_ratio:rate5m`), of an identifier, or of a URL
# template's placeholder (`{sidecar_ip}`); then its matchers, if any.
SELECTOR = re.compile(
    r"(?<![\w:{])((?:sidecar|process)_[a-z0-9_]+)(?![\w:])(?:\s*\{([^{}]*)\})?")
MATCHER = re.compile(r'([a-zA-Z_]\w*)\s*(?:(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)")?')
# Alternatives of plain values (`open|half_open`): each must be one exported.
LITERALS = re.compile(r"[A-Za-z0-9_.-]+(?:\|[A-Za-z0-9_.-]+)*")
# Labels Prometheus adds to every target (or a promtool test gives its series).
TARGET_LABELS = {"job", "instance"}
# Status codes appear as they are answered: any three digits is one.
STATUS = re.compile(r"[1-5][0-9][0-9]")


@dataclass(frozen=True)
class Exported:
    """One scrape: each sample name and the values each of its labels took."""

    labels: dict[str, dict[str, set[str]]]

    @classmethod
    def parse(cls, exposition: str) -> Exported:
        labels: dict[str, dict[str, set[str]]] = defaultdict(lambda: defaultdict(set))
        for family in text_string_to_metric_families(exposition):
            for sample in family.samples:
                found = labels[sample.name]
                for name, value in sample.labels.items():
                    found[name].add(value)
        return cls(labels)

    def problems(self, text: str, where: str) -> Iterator[str]:
        """What in `text` names a series or label value this scrape does not hold."""
        for selector in SELECTOR.finditer(text):
            metric, matchers = selector[1], selector[2]
            if metric not in self.labels:
                yield f"{where}: {metric} is not exported"
                continue
            for matcher in MATCHER.finditer(matchers or ""):
                yield from self._matcher_problems(metric, matcher, where)

    def _matcher_problems(self, metric: str, matcher: re.Match[str], where: str
                          ) -> Iterator[str]:
        label, operator, value = matcher[1], matcher[2], matcher[3]
        if label in TARGET_LABELS:
            return
        values = self.labels[metric].get(label)
        if values is None:
            yield f"{where}: {metric} has no label {label!r}"
            return
        if operator is None or "$" in value or (label == "code" and (
                STATUS.fullmatch(value) or operator in ("=~", "!~"))):
            return
        if operator in ("=", "!="):
            wanted = [value]
        elif LITERALS.fullmatch(value):
            wanted = value.split("|")
        else:  # a pattern (`5..`): it must match a value exported now
            if not any(re.fullmatch(value, each) for each in values):
                yield f"{where}: no {metric}{{{label}}} matches {value!r}"
            return
        for each in wanted:
            if each not in values:
                yield (f"{where}: {metric}{{{label}={each!r}}} is never exported "
                       f"(it has {sorted(values)})")


@pytest.fixture(scope="module")
def exported(local_s3: LocalS3, tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """/metrics of a fresh sidecar, read as Prometheus reads it: the labelled
    families are declared with every value at start, so nothing waits for traffic."""
    cache = tmp_path_factory.mktemp("cache")
    with SidecarProcess(local_s3.endpoint, cache, "--metrics-listen", "127.0.0.1:0"
                        ) as sidecar, \
            urllib.request.urlopen(sidecar.metrics_url + "/metrics", timeout=30) as response:
        return Exported.parse(response.read().decode())


def dashboard_queries() -> Iterator[tuple[str, str]]:
    board = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield f"dashboard panel {panel['title']!r}", target["expr"]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            yield f"dashboard variable {variable['name']!r}", variable["query"]["query"]


def deploy_texts() -> Iterator[tuple[str, str]]:
    """Every deployment file that names metrics, as written: rules with their
    descriptions, promtool tests, manifests' comments, the README. The dashboard
    is read as its queries (its JSON escapes quotes; the generator's f-strings
    are not PromQL until run, and test_observability holds the JSON to them); the
    warm-up plan's JSON names plan fields (`sidecar_url`), no metric."""
    for path in sorted(DEPLOY.rglob("*")):
        if path.is_file() and path.suffix in (".md", ".yml", ".yaml", ".service"):
            yield str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
    yield from dashboard_queries()


def test_every_metric_deploy_names_is_exported_with_its_labels(exported: Exported) -> None:
    named = 0
    problems: list[str] = []
    for where, text in deploy_texts():
        named += len(SELECTOR.findall(text))
        problems += exported.problems(text, where)
    assert named > 100, named  # the rules, the dashboard and the README all name some
    assert not problems, "\n".join(problems)


def test_the_check_catches_each_kind_of_mismatch(exported: Exported) -> None:
    text = """
      sidecar_served_byte_total
      sidecar_mode{mode=~"cache-only|degraded"} == 1
      sidecar_cache_lookups_total{outcome="hit"}
      sidecar_origin_breaker_state{state="half-open"}
      sum(sidecar_requests_total{code=~"5..", op="GetObjects"})
    """
    assert sorted(exported.problems(text, "t")) == sorted([
        "t: sidecar_served_byte_total is not exported",
        "t: sidecar_mode{mode='degraded'} is never exported "
        "(it has ['bypass', 'cache-only', 'no-prefetch', 'normal'])",
        "t: sidecar_cache_lookups_total has no label 'outcome'",
        "t: sidecar_origin_breaker_state{state='half-open'} is never exported "
        "(it has ['closed', 'half_open', 'open'])",
        "t: sidecar_requests_total{op='GetObjects'} is never exported "
        "(it has ['GetObject', 'HeadObject'])",
    ])
    # What is right passes: recorded series, placeholders, target labels, any status.
    assert list(exported.problems(
        'instance:sidecar_byte_hit_ratio:rate5m `{sidecar_ip}` '
        'sidecar_requests_total{job=~"$job",code="503"} '
        'sidecar_thread_cpu_seconds_total{thread} process_cpu_seconds_total', "t")) == []


# --- options and flags -----------------------------------------------------------------

# `name = value` as TOML writes an option (spaces around "=", a TOML value): not a
# systemd `Key=value`, a shell `NAME=value`, a properties `a.b=c`, nor PromQL's `==`.
ASSIGNMENT = re.compile(
    r'(?<![\w.$-])([a-z][a-z0-9]*(?:_[a-z0-9]+)*) = '
    r'("[^"\n]*"|true|false|-?[0-9][0-9_.]*|\[[^\]\n]*\]|\{[^}\n]*\})')
# Inline code in Markdown, and the lines of its fenced blocks.
INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
FENCED = re.compile(r"^```[a-z]*\n(.*?)^```", re.M | re.S)


# Capitals stand for the operator's own value (`s3://BUCKET/PREFIX/`), which is
# checked as a lowercase stand-in would be.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z0-9_]+\b")


def options_by_key() -> dict[str, list[Option]]:
    """Each option under its flat name, and under its key in a TOML table too
    (`[access] bucket_admin` is access_bucket_admin: sidecar.config.flatten_sections)."""
    keys: dict[str, list[Option]] = defaultdict(list)
    for option in OPTIONS:
        keys[option.name].append(option)
        key = option.name.partition("_")[2]
        if key:
            keys[key].append(option)
    return keys


def option_problems(text: str, where: str) -> Iterator[str]:
    """What in `text` sets an option that does not exist, or to a value it refuses."""
    keys = options_by_key()
    for assignment in ASSIGNMENT.finditer(text):
        name, written = assignment[1], assignment[2]
        candidates = keys.get(name)
        if not candidates:
            yield f"{where}: {name} is no option (`{assignment[0]}`)"
            continue
        try:
            value = tomllib.loads(
                f"v = {PLACEHOLDER.sub(lambda m: m[0].lower(), written)}")["v"]
        except tomllib.TOMLDecodeError as exc:
            yield f"{where}: `{assignment[0]}` is not TOML: {exc}"
            continue
        refusals = []
        for option in candidates:
            try:
                option.parse(value)
            except (ConfigError, TypeError, ValueError) as exc:
                refusals.append(str(exc))
        if len(refusals) == len(candidates):
            yield f"{where}: `{assignment[0]}` is refused: {refusals[0]}"


def command_problem(words: list[str], where: str) -> str | None:
    """Why `sidecar WORDS...` would not get past the command line's parser, or None."""
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(words)
    except SystemExit as exc:
        if exc.code:
            return f"{where}: `sidecar {shlex.join(words)}`: {errors.getvalue().strip()}"
    return None


def readme_commands(text: str, where: str) -> Iterator[str]:
    """The README's `sidecar ...` commands, and the `--flag VALUE` settings of its
    tables (serve's flags: the tables list what an operator sets)."""
    for code in INLINE_CODE.findall(text) + [line for block in FENCED.findall(text)
                                             for line in block.splitlines()]:
        if not code.strip().startswith("sidecar "):
            continue
        words = shlex.split(code.strip(), comments=True)
        if len(words) > 1:
            problem = command_problem(words[1:], where)
            if problem:
                yield problem
    for row in (line for line in text.splitlines() if line.lstrip().startswith("|")):
        for code in INLINE_CODE.findall(row):
            if code.startswith("--"):
                problem = command_problem(["serve", *shlex.split(code)], where)
                if problem:
                    yield problem


def test_every_option_and_command_deploy_names_is_the_sidecars() -> None:
    problems: list[str] = []
    assignments = commands = 0
    for path in sorted(DEPLOY.rglob("*")):
        if not path.is_file() or path.suffix not in (".md", ".yml", ".yaml", ".service"):
            continue
        where, text = str(path.relative_to(ROOT)), path.read_text(encoding="utf-8")
        assignments += len(ASSIGNMENT.findall(text))
        problems += option_problems(text, where)
        if path.suffix == ".md":
            commands += sum(1 for code in INLINE_CODE.findall(text)
                            if code.startswith(("sidecar ", "--")))
            problems += readme_commands(text, where)
    assert assignments > 30 and commands > 5, (assignments, commands)
    assert not problems, "\n".join(problems)


def test_the_option_and_command_checks_can_fail() -> None:
    text = """
      `stop_timeout = "20 seconds"` and `disk_reserved = "10GiB"`, `nice = 10`
      [access]
      bucket_admin = "maybe"

      | CPU | `--cpus 3` | `--pin-cpus 3` |
      `sidecar replay --endpoint http://127.0.0.1:9330 --max-bytes 64MiB`
    """
    options = list(option_problems(text, "t"))
    assert [line.split(":")[1].strip() for line in options] == [
        '`stop_timeout = "20 seconds"` is refused',
        'disk_reserved is no option (`disk_reserved = "10GiB"`)',
        '`bucket_admin = "maybe"` is refused'], options
    commands = list(readme_commands(text, "t"))
    assert len(commands) == 2, commands
    assert "the following arguments are required: --bucket" in commands[0]
    assert "unrecognized arguments: --pin-cpus 3" in commands[1]
