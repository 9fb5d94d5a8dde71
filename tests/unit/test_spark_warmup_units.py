"""Sizes and rates in the plan, and the run's summary arithmetic."""

from __future__ import annotations

import pytest

from spark_warmup.__main__ import local_environment, main, session_settings
from spark_warmup.outcome import WarmRow, format_summary, summarize
from spark_warmup.units import format_bytes, parse_rate, parse_size

MIB = 1024 * 1024


@pytest.mark.parametrize(
    ("text", "expected"),
    [("8MiB", 8 * MIB), ("500MB", 500_000_000), ("1.5GiB", 3 * 512 * MIB), ("4096", 4096),
     (" 2 kib ", 2048), ("10GB", 10**10), (123, 123), ("0", 0), ("1TiB", 1024**4)],
)
def test_parse_size(text: object, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["lots", "8 MiBs", "-1MiB", "", True, -5, 1.5, None, "1e6",
                                 "9" * 400, "9" * 400 + "MiB", "9000000TiB"])
def test_bad_sizes(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("200MiB/s", 200.0 * MIB), ("100MB/s", 1e8), ("1.5GB/s", 1.5e9), ("4096/s", 4096.0),
     (" 64 MiB/s ", 64.0 * MIB)],
)
def test_parse_rate(text: str, expected: float) -> None:
    assert parse_rate(text) == expected


@pytest.mark.parametrize("bad", ["200MiB", "fast/s", "0MiB/s", "/s", 100, None, "unlimited"])
def test_bad_rates(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_rate(bad)


def test_format_bytes() -> None:
    assert format_bytes(0) == "0 B"
    assert format_bytes(1023) == "1023 B"
    assert format_bytes(1536 * 1024) == "1.5 MiB"
    assert format_bytes(3 * 1024**4) == "3.0 TiB"


def row(node: str, size: int, **counts: object) -> WarmRow:
    return WarmRow("t", 0, f"k{size}{node}", node, size, **counts)  # type: ignore[arg-type]


def test_summary_of_a_run_with_a_failure() -> None:
    rows = [row("a", 4 * MIB, blocks=4, fetched=3, already_cached=1, bytes_fetched=3 * MIB),
            row("a", 2 * MIB, blocks=2, fetched=1, failed=1, bytes_fetched=MIB),
            row("b", 6 * MIB, blocks=6, failed=6, error="sidecar b unreachable")]
    summary = summarize(rows, seconds=2.0)
    assert summary.planned_bytes == 12 * MIB
    assert summary.warmed_bytes == 4 * MIB
    assert summary.failed_bytes == 8 * MIB and summary.failed_segments == 2
    assert summary.fetched_bytes == 4 * MIB
    assert (summary.fetched_blocks, summary.already_cached_blocks) == (4, 1)
    assert summary.mb_per_s == pytest.approx(4 * MIB / 2.0 / 1e6)
    assert summary.nodes["b"].failed_segments == 1 and summary.nodes["a"].warmed_bytes == 4 * MIB
    text = format_summary(summary, failures=[r for r in rows if not r.ok])
    assert "planned 12.0 MiB, warmed 4.0 MiB" in text and "failed 8.0 MiB in 2 segments" in text
    assert "3 segments on 2 sidecars" in text and "1 block already cached" in text
    assert "2.0 MiB/s effective" in text  # 4 MiB in 2 s, in the units of every size shown
    # Each failed segment on the console, with its reason.
    assert f"failed: t-0 k{2 * MIB}a on a: 1 of 2 blocks failed" in text
    assert f"failed: t-0 k{6 * MIB}b on b: sidecar b unreachable" in text
    assert summary.as_dict()["mb_per_s"] == round(summary.mb_per_s, 3)


def test_only_the_first_failures_are_named_on_the_console() -> None:
    rows = [row("a", (n + 1) * MIB, blocks=1, failed=1) for n in range(8)]
    text = format_summary(summarize(rows, seconds=1.0), failures=rows)
    assert text.count("  failed: ") == 5
    assert "... and 3 more failed segments (--report DIR lists every one" in text
    assert "8 segments on 1 sidecar:" in text


def test_dry_run_estimates_at_each_nodes_rate() -> None:
    rows = [row("a", 100 * MIB), row("a", 100 * MIB), row("b", 50 * MIB)]
    rates = {"a": 100.0 * MIB, "b": 10.0 * MIB}
    summary = summarize(rows, 0.0, dry_run=True, rates=rates)
    assert summary.nodes["a"].estimated_seconds == pytest.approx(2.0)
    assert summary.nodes["b"].estimated_seconds == pytest.approx(5.0)
    assert summary.seconds == pytest.approx(5.0)  # side by side: the slowest node
    assert summary.warmed_bytes == 0 and summary.failed_bytes == 0
    text = format_summary(summary, rates)
    assert "dry run: 3 segments, 250.0 MiB planned on 2 sidecars; estimated 5.0 s" in text
    assert "b: 1 segment, 50.0 MiB, ~5.0 s at 10.0 MiB/s" in text


def test_a_real_run_keeps_the_plans_estimate_beside_the_time_it_took() -> None:
    rows = [row("a", 100 * MIB, blocks=100, fetched=100), row("b", 50 * MIB, blocks=50,
                                                              fetched=50)]
    rates = {"a": 100.0 * MIB, "b": 10.0 * MIB}
    summary = summarize(rows, seconds=6.5, rates=rates)
    assert summary.seconds == 6.5 and summary.estimated_seconds == pytest.approx(5.0)
    assert summary.nodes["a"].estimated_seconds == pytest.approx(1.0)
    assert summary.as_dict()["estimated_seconds"] == pytest.approx(5.0)
    assert "6.5 s (estimated 5.0 s)" in format_summary(summary, rates)


def test_an_empty_run() -> None:
    summary = summarize([], seconds=0.0)
    assert summary.segments == 0 and summary.mb_per_s == 0.0


@pytest.mark.parametrize(
    ("master", "conf", "env", "bound"),
    [
        ("local[2]", {}, {}, "127.0.0.1"),
        (None, {}, {}, "127.0.0.1"),  # local[*]
        ("local[2]", {"spark.driver.bindAddress": "10.1.2.3"}, {}, "10.1.2.3"),
        ("local[2]", {}, {"SPARK_LOCAL_IP": "10.1.2.3"}, None),
        ("spark://m:7077", {}, {}, None),  # executors elsewhere must reach the driver
        (None, {}, {"PYSPARK_GATEWAY_PORT": "4242"}, None),  # under spark-submit
    ],
)
def test_a_local_driver_listens_on_loopback_unless_told_otherwise(
    master: str | None, conf: dict[str, str], env: dict[str, str], bound: str | None
) -> None:
    settings = session_settings(master, conf, env)
    assert settings.get("spark.driver.bindAddress") == bound
    assert {key: settings[key] for key in conf} == conf


@pytest.mark.parametrize(
    ("master", "env", "set_ip"),
    [
        ("local[2]", {}, "127.0.0.1"),
        (None, {}, "127.0.0.1"),  # local[*]
        ("local[2]", {"SPARK_LOCAL_IP": "10.1.2.3"}, None),  # the operator's choice stands
        ("spark://m:7077", {}, None),  # executors elsewhere must reach the driver
        (None, {"PYSPARK_GATEWAY_PORT": "4242"}, None),  # under spark-submit
    ],
)
def test_a_local_jvm_binds_its_web_ui_to_loopback_unless_told_otherwise(
    master: str | None, env: dict[str, str], set_ip: str | None
) -> None:
    assert local_environment(master, env).get("SPARK_LOCAL_IP") == set_ip


@pytest.mark.parametrize("seconds", ["inf", "1e300", "nan", "-1", "86401"])
def test_a_progress_interval_that_cannot_be_kept_is_refused(
    seconds: str, capsys: pytest.CaptureFixture[str],
) -> None:
    # Refused before the plan is read (it does not exist) and before Spark starts.
    assert main(["no-such-plan.json", "--progress", seconds]) == 2
    assert capsys.readouterr().err == ("spark_warmup: error: --progress must be 0 (none) to "
                                       f"86400 seconds, got {float(seconds)}\n")
