"""Shared helpers of the Python tests."""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field


@dataclass
class Record:
    """An independent record of admissions: for each admitted call, the
    instant before it asked and the instant after it was admitted (its
    reservation lies between), and what it was finally charged.

    ``over_limit(window, limit)`` finds a window that certainly held more
    than ``limit``: calls whose whole [asked, admitted] interval lies
    inside one window of length ``window`` were certainly admitted in it.
    """

    entries: list[tuple[float, float, int]] = field(default_factory=list)

    def add(self, asked: float, admitted: float, amount: int = 1) -> None:
        self.entries.append((asked, admitted, amount))

    def worst_window(self, window: float) -> int:
        """The largest amount certainly admitted within one window."""
        entries = sorted(self.entries)
        asks = [e[0] for e in entries]
        worst = 0
        for i, (start, _, _) in enumerate(entries):
            end = start + window
            stop = bisect.bisect_left(asks, end, lo=i)
            total = sum(a for (_, admitted, a) in entries[i:stop] if admitted < end)
            worst = max(worst, total)
        return worst


def now() -> float:
    return time.monotonic()
