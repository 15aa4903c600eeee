"""The engines' cumulative counters (per replica, as scraped) turned into
increments between two scrapes.

A replica's first reading is only a baseline: what it counted before the
gateway saw it is not news. A counter that went down means the replica
restarted (its process counts from 0 again); then the whole new reading is
the increment, as Prometheus' `rate()` does. The counters of one replica
restart together, so one that went down resets them all: a queue-time sum
that restarted while its count happened to climb past the old value would
otherwise give a nonsense mean."""

from __future__ import annotations

from dataclasses import dataclass

from ..fleet.load import LoadReading

COUNTERS = ("preemptions", "queue_time_sum", "queue_time_count")


@dataclass(frozen=True)
class Increments:
    preemptions: float = 0.0
    queue_time_sum: float = 0.0
    queue_time_count: float = 0.0


class CounterDeltas:
    """The last reading of each replica, by name."""

    def __init__(self) -> None:
        self._last: dict[str, LoadReading] = {}

    def advance(self, name: str, reading: LoadReading) -> Increments | None:
        """The increments since this replica's previous reading; None for its
        first reading, or one not newer than the previous (a failed scrape
        leaves the old reading in place)."""
        previous = self._last.get(name)
        if previous is not None and reading.at <= previous.at:
            return None
        self._last[name] = reading
        if previous is None:
            return None
        if any(getattr(reading, c) < getattr(previous, c) for c in COUNTERS):
            return Increments(**{c: getattr(reading, c) for c in COUNTERS})
        return Increments(**{c: getattr(reading, c) - getattr(previous, c) for c in COUNTERS})

    def forget_others(self, names: set[str]) -> None:
        """Drop replicas no longer in the fleet (DNS discovery removes them)."""
        for name in [n for n in self._last if n not in names]:
            del self._last[name]
