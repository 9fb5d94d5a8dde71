"""`GET /ui`: the built-in hit-rate page, one self-contained HTML document
(`ui.html`, shipped in the package).

No external assets (the Content-Security-Policy below forbids them): inline CSS,
inline JavaScript drawing on <canvas>. The page polls `/api/v1/stats` every
`interval_ms` (default 2000, a query parameter) and keeps the last HISTORY
samples in memory, so charts start empty when it is opened and fill as it runs.

Stable hooks for tests and scripts: every figure is an element with an id whose
`data-value` holds the raw number from the stats JSON (empty when n/a); each
chart's <canvas> carries `data-points` (samples drawn) and `data-draws`; <body>
carries `data-samples` (successful polls) and `data-error` (the last failure).
"""

from __future__ import annotations

from importlib import resources

# Same-origin fetches and inline code only: an asset the page tried to load from
# elsewhere would be blocked, which keeps "self-contained" true by construction.
CSP = (
    "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; "
    "style-src 'unsafe-inline'; img-src data:; base-uri 'none'; form-action 'none'"
)

PAGE = resources.files(__package__).joinpath("ui.html").read_text(encoding="utf-8")
