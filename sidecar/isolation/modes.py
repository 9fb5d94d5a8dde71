"""Download modes: what the operator asked for, and what the disk forces.

- normal: cache, read ahead, fetch misses.
- no-prefetch: no read-ahead (the sidecar's own guesses); misses are fetched,
  and warm-up, which an operator asks for by name, still runs.
- cache-only: hits are served; misses get 503 and nothing is downloaded
  (pauses tiered downloads on demand).
- bypass: the cache is not used; reads go to the origin as they come.

A failing cache disk (ENOSPC, EIO) forces bypass whatever the operator mode,
until the disk recovers; the operator mode is kept and comes back then.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

log = logging.getLogger(__name__)


class Mode(enum.Enum):
    NORMAL = "normal"
    NO_PREFETCH = "no-prefetch"
    CACHE_ONLY = "cache-only"
    BYPASS = "bypass"


# How much of an unknown mode the error quotes: PUT /api/v1/mode may carry up
# to aiohttp's client_max_size (1 MiB), and the 400 must not echo it back.
MAX_QUOTED_CHARS = 40


def parse_mode(value: object) -> Mode:
    try:
        return Mode(str(value))
    except ValueError:
        names = ", ".join(mode.value for mode in Mode)
        raise ValueError(f"unknown mode {_quoted(value)} (expected one of: {names})") from None


def _quoted(value: object) -> str:
    """The value as the error quotes it: whole, or its start and its length."""
    text = repr(value)
    if len(text) <= MAX_QUOTED_CHARS + 20:
        return text
    return f"{text[:MAX_QUOTED_CHARS]}... ({len(text)} characters)"


class ModeState:
    def __init__(self, on_change: Callable[[Mode], None] = lambda mode: None) -> None:
        self._requested = Mode.NORMAL
        self._disk_problem: str | None = None
        self._on_change = on_change

    @property
    def requested(self) -> Mode:
        return self._requested

    @property
    def disk_problem(self) -> str | None:
        return self._disk_problem

    @property
    def current(self) -> Mode:
        return Mode.BYPASS if self._disk_problem is not None else self._requested

    @property
    def downloads(self) -> bool:
        """Misses may be fetched from the origin."""
        return self.current is not Mode.CACHE_ONLY

    @property
    def read_ahead(self) -> bool:
        return self.current is Mode.NORMAL

    @property
    def caching(self) -> bool:
        return self.current is not Mode.BYPASS

    def request(self, mode: Mode) -> None:
        self._update(lambda: setattr(self, "_requested", mode))
        held = "" if self._disk_problem is None else \
            f"; the cache stays bypassed until its disk recovers ({self._disk_problem})"
        log.warning("mode set to %s by the operator%s", mode.value, held,
                    extra={"mode": self.current.value, "requested_mode": mode.value})

    def disk_failed(self, problem: str) -> None:
        if self._disk_problem is None:
            log.error("cache disk failed (%s): bypassing the cache until it recovers", problem,
                      extra={"mode": Mode.BYPASS.value, "disk_problem": problem})
        self._update(lambda: setattr(self, "_disk_problem", problem))

    def disk_recovered(self) -> None:
        if self._disk_problem is not None:
            log.warning("cache disk recovered: back to mode %s", self._requested.value,
                        extra={"mode": self._requested.value})
        self._update(lambda: setattr(self, "_disk_problem", None))

    def _update(self, change: Callable[[], None]) -> None:
        before = self.current
        change()
        if self.current is not before:
            self._on_change(self.current)
