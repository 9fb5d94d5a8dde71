"""Results -> targets and BENCHMARKS.md. Pure: a results dict in, text out."""

from __future__ import annotations

from typing import Any

MiB = 1024 * 1024
HIT_RATIO_MIN_REPLAY = 512 * MiB


# --- reading the results ---------------------------------------------------------------


def _run(results: dict[str, Any], scenario: str, run: str) -> dict[str, Any] | None:
    found = ((results.get("scenarios") or {}).get(scenario) or {}).get("runs", {}).get(run)
    return found if isinstance(found, dict) else None


def _mbps(run: dict[str, Any] | None) -> float | None:
    value = run.get("mb_per_s") if run else None
    return float(value) if isinstance(value, int | float) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return a / b


def _sidecar_stat(run: dict[str, Any] | None, name: str) -> Any:
    if not run:
        return None
    stats = run.get("sidecar")
    if isinstance(stats, dict) and stats.get(name) is not None:
        return stats[name]
    return run.get(name)


def _integrity_problem(*runs: dict[str, Any] | None) -> str | None:
    for run in runs:
        if run is None:
            continue
        if run.get("crc_errors"):
            return f"{run['crc_errors']} batch check failures"
        if run.get("exit_code") not in (None, 0):
            return f"replay exited {run['exit_code']}"
        errors = run.get("errors")
        if isinstance(errors, dict) and any(errors.values()):
            return f"wrk errors {errors}"
    return None


def _target(
    name: str, required: str, value: float | None, shown: str, met: bool | None,
    note: str = "",
) -> dict[str, Any]:
    return {"target": name, "required": required, "value": value, "measured": shown,
            "met": met, "note": note}


def _times(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _pct(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{100 * value:.{digits}f}%"


def evaluate_targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each met / not met / not measured (None)."""
    targets = []

    def ratio_target(name: str, required: str, scenario: str, run: str, base: str,
                     minimum: float) -> None:
        ours, theirs = _run(results, scenario, run), _run(results, scenario, base)
        value = _ratio(_mbps(ours), _mbps(theirs))
        problem = _integrity_problem(ours, theirs)
        met = None if value is None else (value >= minimum and problem is None)
        targets.append(_target(name, required, value, _times(value), met, problem or ""))

    ratio_target("1 partition cold: sidecar vs origin direct", ">= 5x",
                 "cold-1p", "sidecar_cold", "origin", 5.0)
    ratio_target("1 partition cold: sidecar vs nginx slice cold", ">= 4x",
                 "cold-1p", "sidecar_cold", "nginx_slice_cold", 4.0)
    ratio_target("4 partitions cold: sidecar vs nginx slice WARM", ">= 0.60x",
                 "cold-4p", "sidecar_cold", "nginx_slice_warm", 0.6)
    ratio_target("4 partitions cold: sidecar vs nginx slice cold", ">= 3x",
                 "cold-4p", "sidecar_cold", "nginx_slice_cold", 3.0)

    cold = _run(results, "cold-4p", "sidecar_cold")
    replayed = cold.get("bytes") if cold else None
    hit = _sidecar_stat(cold, "byte_hit_ratio")
    note = ""
    met: bool | None = None
    if hit is not None and replayed is not None:
        met = hit >= 0.99 and replayed >= HIT_RATIO_MIN_REPLAY
        if replayed < HIT_RATIO_MIN_REPLAY:
            met = None
            note = (f"replay was {replayed / MiB:.0f} MiB, the target needs >= 512 MiB "
                    "(quick run: indicative only)")
    problem = _integrity_problem(cold)
    if problem and met is not None:
        met, note = False, problem
    targets.append(_target("byte hit ratio, cold replay, no warm-up", ">= 99% over >= 512 MiB",
                           hit, _pct(hit), met, note))

    origin_bytes = _sidecar_stat(cold, "origin_bytes")
    value = _ratio(origin_bytes, replayed)
    met = None if value is None else value <= 1.05
    targets.append(_target("origin bytes / bytes replayed (4 partitions cold)", "<= 1.05x",
                           value, _times(value), met))

    sidecar = _run(results, "warm-ranges", "sidecar_warm")
    local = _run(results, "warm-ranges", "nginx_local")
    rps = _ratio(sidecar.get("requests_per_s") if sidecar else None,
                 local.get("requests_per_s") if local else None)
    problem = _integrity_problem(sidecar, local)
    met = None if rps is None else (rps >= 0.7 and problem is None)
    targets.append(_target("warm 1 MiB ranges: sidecar vs nginx local file, throughput",
                           ">= 70%", rps, _pct(rps, 1), met, problem or ""))
    p99 = _ratio((sidecar or {}).get("latency_ms", {}).get("p99"),
                 (local or {}).get("latency_ms", {}).get("p99"))
    met = None if p99 is None else (p99 <= 2.0 and problem is None)
    targets.append(_target("warm 1 MiB ranges: sidecar p99 / nginx local file p99",
                           "<= 2x", p99, _times(p99), met, problem or ""))
    return targets


# --- rendering -----------------------------------------------------------------------


def _num(value: Any, digits: int = 1) -> str:
    return "n/a" if not isinstance(value, int | float) else f"{value:,.{digits}f}"


def _status(met: bool | None) -> str:
    return {True: "met", False: "**not met**", None: "not measured"}[met]


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


_LABELS = {
    "origin": "origin direct",
    "nginx_slice_cold": "nginx slice 8m + proxy_cache, cold",
    "nginx_slice_warm": "nginx slice 8m + proxy_cache, warm (2nd replay)",
    "nginx_slice_lock_cold": "nginx slice 8m + proxy_cache + proxy_cache_lock, cold (extra)",
    "sidecar_cold": "**sidecar, cold**",
    "sidecar_warm": "**sidecar, warm**",
    "nginx_local": "nginx, local file (no delay, no rate limit)",
}


def _replay_rows(
    results: dict[str, Any], scenario: str, runs: list[str], bases: list[tuple[str, str]]
) -> list[list[str]]:
    rows = []
    for run in runs:
        data = _run(results, scenario, run)
        label = _LABELS.get(run, run)
        if data is None:
            rows.append([label, "failed / not run", *["" for _ in bases], "", "", "", "", ""])
            continue
        latency = data.get("fetch_latency_ms") or {}
        ratios = [_times(_ratio(_mbps(data), _mbps(_run(results, base_scenario, base))))
                  for base_scenario, base in bases]
        origin_ratio = data.get("origin_body_bytes_per_replayed_byte")
        sidecar = data.get("sidecar") if isinstance(data.get("sidecar"), dict) else None
        hit = _pct(sidecar.get("byte_hit_ratio")) if sidecar else "-"
        rows.append([
            label, _num(_mbps(data)), *ratios, _num(latency.get("p50")), _num(latency.get("p99")),
            hit, _times(origin_ratio), str(data.get("crc_errors", "n/a")),
        ])
    return rows


def _replay_header(bases: list[tuple[str, str]]) -> list[str]:
    names = {"origin": "origin", "nginx_slice_cold": "slice cold",
             "nginx_slice_warm": "slice warm", "sidecar_cold": "sidecar cold"}
    return ["path", "MB/s", *[f"x {names.get(base, base)}" for _, base in bases],
            "fetch p50 ms", "fetch p99 ms", "byte hit ratio", "origin bytes / replayed",
            "CRC errors"]


def _scenario_line(results: dict[str, Any], scenario: str) -> str:
    info = (results.get("scenarios") or {}).get(scenario) or {}
    size = info.get("bytes")
    return (f"partitions `{info.get('partitions', '?')}`, concurrency {info.get('concurrency', '?')}, "
            f"{_num(size / MiB if size else None, 0)} MiB per replay, 1 MiB fetches "
            "(open-ended range, connection dropped after each fetch)")


def _prefetch_line(results: dict[str, Any], scenario: str, run: str) -> str:
    data = _run(results, scenario, run)
    if data is None:
        return ""
    samples = data.get("sidecar_prefetch_blocks_total")
    stats = data.get("sidecar") or {}
    shown = "absent (no read-ahead in this build)" if not samples else ", ".join(
        f"{key.removeprefix('outcome=')} {int(value)}" for key, value in sorted(samples.items()))
    return (f"Sidecar `sidecar_prefetch_blocks_total` after the run: {shown}; origin read "
            f"{_num((stats.get('origin_bytes') or 0) / 1e6)} MB for "
            f"{_num((data.get('bytes') or 0) / 1e6)} MB replayed; listing via "
            f"{data.get('listed_via', '?')}.")


def render_markdown(results: dict[str, Any]) -> str:
    machine = results.get("machine") or {}
    dataset = results.get("dataset") or {}
    quick = results.get("quick")
    out: list[str] = []
    out.append("# Benchmarks\n")
    out.append(
        "Generated by the benchmark harness (`bench/`); do not edit by hand, rerun it. "
        "Every number below was measured in one run, side by side, against one emulated "
        "object store.\n"
    )
    if quick:
        out.append("> **Quick run** (`--quick`): a 256 MiB data set and short wrk runs, to check "
                   "the harness. Not the benchmark: run `make bench` for that.\n")
    out.append(_table(["", ""], [
        ["command", f"`{results.get('command', 'make bench')}`"],
        ["date (UTC)", f"{results.get('started_at', '?')} .. {results.get('finished_at', '?')} "
                       f"({_num(results.get('seconds'), 0)} s)"],
        ["machine", f"{machine.get('cpu_model', '?')}, {machine.get('cores', '?')} cores, "
                    f"{machine.get('ram_gib', '?')} GiB RAM"],
        ["uname -a", f"`{machine.get('uname_a') or machine.get('uname', '?')}`"],
        ["software", f"Python {machine.get('python', '?')}, {machine.get('nginx', '?')}, "
                     f"{machine.get('wrk', '?')}, Debian {machine.get('debian', '?')}"],
        ["commit", f"`{machine.get('git_commit', '?')}`"
                   f"{' (with uncommitted changes)' if machine.get('git_dirty') else ''}"],
        ["data set", f"{dataset.get('objects', '?')} genuine Kafka segments of topic "
                     f"`{dataset.get('topic', '?')}`: {dataset.get('partitions', '?')} partitions x "
                     f"{dataset.get('segments_per_partition', '?')} segments x "
                     f"{_num((dataset.get('segment_bytes') or 0) / MiB, 0)} MiB = "
                     f"{_num((dataset.get('bytes') or 0) / MiB, 1)} MiB, record values "
                     f"{dataset.get('value_size', '?')} B"],
        ["raw results", "`bench/results/latest.json` (and the timestamped file beside it)"
         if not quick else "`bench/results/*-quick.json`"],
    ]))
    out.append("")

    out.append("## Targets\n")
    rows = [[t["target"], t["required"], t["measured"], _status(t["met"]), t.get("note", "")]
            for t in results.get("targets") or evaluate_targets(results)]
    out.append(_table(["target", "required", "measured", "status", "note"], rows))
    out.append("")
    missed = [t for t in results.get("targets") or [] if t["met"] is False]
    if missed:
        out.append(f"{len(missed)} of {len(rows)} targets are **not met** in this run.\n")

    out.append("## One partition, cold\n")
    out.append(_scenario_line(results, "cold-1p") + ". Fresh servers and empty caches for each "
               "row.\n")
    bases = [("cold-1p", "origin"), ("cold-1p", "nginx_slice_cold")]
    out.append(_table(_replay_header(bases), _replay_rows(
        results, "cold-1p", ["origin", "nginx_slice_cold", "nginx_slice_lock_cold",
                             "sidecar_cold"], bases)))
    out.append("")
    out.append(_prefetch_line(results, "cold-1p", "sidecar_cold") + "\n")

    out.append("## Four partitions at once, cold\n")
    out.append(_scenario_line(results, "cold-4p") + ". The nginx slice cache is replayed twice: "
               "the second replay is the *warm* row.\n")
    bases = [("cold-4p", "origin"), ("cold-4p", "nginx_slice_cold"),
             ("cold-4p", "nginx_slice_warm")]
    out.append(_table(_replay_header(bases), _replay_rows(
        results, "cold-4p", ["origin", "nginx_slice_cold", "nginx_slice_lock_cold",
                             "nginx_slice_warm", "sidecar_cold"], bases)))
    out.append("")
    out.append(_prefetch_line(results, "cold-4p", "sidecar_cold") + "\n")

    out.append("## Warm replay\n")
    out.append("The four-partition replay again, against the sidecar the cold replay filled.\n")
    bases = [("cold-4p", "nginx_slice_warm"), ("cold-4p", "sidecar_cold")]
    out.append(_table(_replay_header(bases), _replay_rows(
        results, "warm-replay", ["sidecar_warm"], bases)))
    out.append("")

    ranges = (results.get("scenarios") or {}).get("warm-ranges") or {}
    out.append("## Warm 1 MiB range reads\n")
    out.append(f"wrk, {ranges.get('connections', '?')} keep-alive connections, "
               f"{ranges.get('threads', '?')} threads, {ranges.get('seconds', '?')} s each: "
               "`GET` with `Range` of a random 1 MiB-aligned 1 MiB range of a random segment "
               f"({ranges.get('aligned_ranges', '?')} ranges). The sidecar is the one warmed "
               "above; nginx serves the same files from local disk (page cache) with no delay "
               "and no rate limit.\n")
    local = _run(results, "warm-ranges", "nginx_local")
    rows = []
    for run in ("nginx_local", "sidecar_warm"):
        data = _run(results, "warm-ranges", run)
        if data is None:
            rows.append([_LABELS[run], "failed / not run", "", "", "", "", "", "", ""])
            continue
        latency = data.get("latency_ms") or {}
        rows.append([
            _LABELS[run], _num(data.get("requests_per_s")), _num(data.get("mb_per_s")),
            _pct(_ratio(data.get("requests_per_s"), (local or {}).get("requests_per_s")), 1),
            _num(latency.get("p50"), 2), _num(latency.get("p90"), 2), _num(latency.get("p99"), 2),
            _num(latency.get("max"), 1), str(sum((data.get("errors") or {}).values())),
        ])
    out.append(_table(["server", "req/s", "MB/s", "vs nginx local", "p50 ms", "p90 ms",
                       "p99 ms", "max ms", "errors"], rows))
    out.append("")

    errors = results.get("errors") or []
    if errors:
        out.append("## Failures in this run\n")
        for error in errors:
            text = " ".join(str(error.get("error", "")).split())[:600]
            out.append(f"- `{error.get('scenario')}/{error.get('run')}`: {text}")
        out.append("")

    out.append(METHOD)
    return "\n".join(out).rstrip() + "\n"


METHOD = """## Running it

```sh
make bench                          # the benchmark: installs nginx-light and wrk if missing,
                                    # writes the 1 GiB data set (bench/data/, reused), runs all,
                                    # writes bench/results/<UTC time>.json, latest.json, BENCHMARKS.md
.venv/bin/python -m bench --quick   # 256 MiB, 5 s wrk runs: checks the harness in about a minute
                                    # (bench/results/*-quick.{json,md}, not committed)
.venv/bin/python -m bench --only cold-1p,warm-ranges   # some of: cold-1p cold-4p warm-replay warm-ranges
.venv/bin/python -m bench --report-only bench/results/latest.json   # only regenerate this file
```

Servers bind 127.0.0.1 on free ports and run as child processes in their own
process groups (never the system nginx service); all are stopped at the end,
on failure and on Ctrl-C/SIGTERM. Configs and logs of a run with failures stay
in `bench/results/tmp/` (`--keep-work` keeps them always).

## How this is measured

**Origin emulator** (DESIGN.md, "Benchmark origin model"): nginx with the echo
module of Debian's `nginx-light`, serving the data set files path-style
(`/tiered/{key}`), first byte after 30 ms, 64 MB/s per connection:

```nginx
location /tiered/ { echo_sleep 0.03; echo_exec @obj; }
location @obj     { root DATA; limit_rate 64m; sendfile_max_chunk 268436; }
```

- `echo_exec` to a named location is an internal redirect of the request itself
  (not a subrequest), so the static module answers as usual after the sleep:
  `Range` (206 + `Content-Range`, 416), `HEAD`, `If-Match` (412), `ETag`,
  `Last-Modified`, `Content-Length` all work through it; the harness's functional
  test checks this with boto3. nginx itself sends `Accept-Ranges` only with a
  200; S3 sends it with 206 too, so the config adds it when the request has a
  `Range` (`add_header` runs before the range filter turns 200 into 206, so it
  cannot key on `$status`).
- `sendfile_max_chunk 268436` is needed for the rate limit to mean anything at
  1 MiB: nginx enforces `limit_rate` by pausing *after* each send for
  bytes/rate (whole milliseconds), and by default one send pushes up to 2 MiB
  into a loopback socket, so a 1 MiB answer arrived in one burst at 30 ms
  (measured 31 ms instead of ~46 ms). With 268436-byte sends (64 MiB/s x 4 ms)
  nginx pauses 4 ms per send: a 1 MiB range takes ~43 ms, an 8 MiB range
  ~160 ms, a whole 64 MiB object ~1.05 s (~64 MB/s after the first byte).
  `limit_rate` is per request, i.e. per connection for sequential requests.
- nginx cannot list, so the harness writes ListObjectsV2 answers (S3 namespace,
  `KeyCount`, `MaxKeys` 1000, `IsTruncated` false, `Contents` with `Key`,
  `LastModified`, `ETag` equal to nginx's own ETag, `Size`, `StorageClass`) for
  every prefix a client can ask: `""`, `orders`, `orders-`, `orders-{topicId}/`
  and each `orders-{topicId}/{p}/`. `GET /tiered?list-type=2&prefix=...` picks
  the file with a `map` on `$arg_prefix`, which nginx does not decode, so each
  prefix is mapped in its percent-encoded form (`orders-X%2F0%2F`, as botocore
  sends it) and with a raw `/`; `map` compares case-insensitively, so `%2f` is
  covered too. An unknown prefix gets an empty listing; `delimiter`,
  `start-after` and continuation tokens are refused with 501 rather than
  answered wrongly. `GET /` answers a one-bucket ListAllMyBucketsResult (the
  sidecar's start-up check), a missing key an S3 `NoSuchKey` XML 404.
- The origin's access log (`$body_bytes_sent` per request) gives the
  "origin bytes / replayed" column for every path: what the origin put on the
  wire, including the part of an open-ended range already sent when the client
  hung up.

**Replay client**: `python -m sidecar replay --fetch-bytes 1MiB --json`, the
same client for every row: per partition one sequential reader that opens the
segment with an open-ended range (`bytes=pos-`), reads 1 MiB (to the end of
the batch it is in), checks every record batch's CRC-32C and offset continuity,
drops the connection and continues after the last whole batch, into the next
segment. MB/s is 10^6 bytes of checked batches per second of replay (listing
not included). Dummy AWS credentials; the origin does not check signatures.

**nginx slice baseline** (the one the targets compare against): `slice 8m;
proxy_cache` (fresh cache directory per cold run),
`proxy_cache_key $uri$is_args$args$slice_range`,
`proxy_set_header Range $slice_range`, `proxy_cache_valid 200 206 1h`,
`proxy_http_version 1.1`, upstream keep-alive, `worker_processes auto`;
listings are proxied uncached. A broker-like reader defeats it in a particular
way: it asks for the next 1 MiB of a slice while nginx is still caching that
slice (nginx finishes a cacheable slice after the client hangs up), so without
a lock each such fetch is a miss that fetches the whole 8 MiB slice from the
origin again (hence its origin bytes of several times the data). The *extra*
row adds `proxy_cache_lock on`: origin bytes drop to ~1x, but nginx re-checks
a held cache lock only every 500 ms, so most slices cost the reader a
~500 ms stall and it is slower still; it is shown for reference and not used
for the targets.

**Sidecar**: `python -m sidecar serve --cache-size 2GiB` with a fresh cache
directory per cold run, defaults otherwise, in front of its own fresh origin
emulator. Hit ratios and origin bytes are the deltas of its `/api/v1/stats`
around each replay.

**Warm range reads**: wrk with a Lua script (`bench/random_ranges.lua`) picking
random 1 MiB-aligned 1 MiB ranges of random segments; the local-file nginx
(`worker_processes auto`, sendfile) serves the same files with no delay and no
rate limit. MB/s counts 1 MiB per successful response.

**Caveats**: everything (client, sidecar, nginx, origin) shares this one
machine and its cores over loopback; the data set sits in the page cache, so
the origin emulator's only costs are the ones it models (latency and
per-connection bandwidth).
"""


def console_summary(results: dict[str, Any]) -> str:
    lines = ["", "targets:"]
    for target in results.get("targets") or []:
        lines.append(f"  {_status(target['met']).replace('**', ''):13} {target['target']}: "
                     f"{target['measured']} (required {target['required']})"
                     + (f"  [{target['note']}]" if target.get("note") else ""))
    for scenario, info in (results.get("scenarios") or {}).items():
        for run, data in (info.get("runs") or {}).items():
            if data is None:
                lines.append(f"  {scenario:12} {run:22} FAILED")
            elif "requests_per_s" in data:
                lines.append(f"  {scenario:12} {run:22} {data['requests_per_s']:>9} req/s "
                             f"{data['mb_per_s']:>9} MB/s  p50 {data['latency_ms']['p50']} ms  "
                             f"p99 {data['latency_ms']['p99']} ms")
            else:
                latency = data.get("fetch_latency_ms") or {}
                lines.append(f"  {scenario:12} {run:22} {data.get('mb_per_s')!s:>9} MB/s  "
                             f"fetch p50 {latency.get('p50')} ms  p99 {latency.get('p99')} ms  "
                             f"byte hit {_pct(_sidecar_stat(data, 'byte_hit_ratio'))}")
    return "\n".join(lines)
