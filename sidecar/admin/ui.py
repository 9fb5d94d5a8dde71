"""`GET /ui`: the operator's page, one self-contained HTML document (`ui.html`,
shipped in the package), meant to stay open beside Grafana.

No external assets (the Content-Security-Policy below forbids them): inline CSS,
inline JavaScript drawing on <canvas>, no build step. The page arrives with the
stats JSON in it, the chart history included (`render`), and draws them before
its first paint: nothing waits for a poll. It then polls
`/api/v1/stats?since=<its newest point>` every `interval_ms` (a query parameter:
default 2000, at least 100, at most a day) and appends the new points, keeping
as many as the sidecar's ring holds.

Stable hooks for tests and scripts: every figure is an element with an id whose
`data-value` holds the raw number from the stats JSON (empty when n/a); each
chart's <canvas> carries `data-points` (points drawn), `data-draws`,
`data-x-ticks` and `data-y-ticks` (the axis labels, JSON lists) and
`data-series` (JSON: each series' label, its points with a value, its largest
value); a chart's legend holds one `.key` per series and a `.note` that, where no
series has a value at the point shown, says what is missing instead ("no GETs in
the last 2 s"); <body> carries `data-samples` (snapshots shown, the embedded one
included), `data-polls` (successful polls) and `data-error` (the last failure);
the warm-call table's rows carry `data-started`.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

# Same-origin fetches and inline code only: an asset the page tried to load from
# elsewhere would be blocked, which keeps "self-contained" true by construction.
CSP = (
    "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)

PAGE = resources.files(__package__).joinpath("ui.html").read_text(encoding="utf-8")
# Where `render` puts the stats: the body of <script type="application/json">.
INITIAL_STATS_MARK = "{/*initial stats*/}"


def render(stats: dict[str, Any]) -> str:
    """The page with `stats` in it, for its first paint."""
    data = json.dumps(stats, separators=(",", ":"), allow_nan=False)
    # A key in the warm calls could hold "</script>": no "<" may reach the HTML
    # parser inside the script element. "\u003c" is the same string to JSON.parse.
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return PAGE.replace(INITIAL_STATS_MARK, data, 1)
