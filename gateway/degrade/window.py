"""Timestamped samples of one quantity and what they add up to over the last
`span_s` seconds: the building block of every degradation signal.

A sample older than the span drops out on the next read, so a single
extreme sample moves a window value for at most one span: the controller's
enter dwell, measured on these values, is what turns "above for a moment"
into "above for minutes"."""

from __future__ import annotations

from collections import deque


class SignalWindow:
    def __init__(self, span_s: float) -> None:
        if span_s <= 0:
            raise ValueError(f"a window must span a positive time (got {span_s} s)")
        self.span_s = span_s
        self._samples: deque[tuple[float, float]] = deque()

    def add(self, at: float, value: float) -> None:
        self._samples.append((at, value))

    def _trim(self, now: float) -> None:
        # strictly younger than the span: a sample leaves exactly one span after it came
        while self._samples and self._samples[0][0] <= now - self.span_s:
            self._samples.popleft()

    def count(self, now: float) -> int:
        self._trim(now)
        return len(self._samples)

    def total(self, now: float) -> float:
        """The sum of the samples in the window (0 when it is empty)."""
        self._trim(now)
        return sum(value for _, value in self._samples)

    def minimum(self, now: float) -> float | None:
        self._trim(now)
        return min((value for _, value in self._samples), default=None)

    def mean(self, now: float) -> float | None:
        """The samples' mean, None when the window is empty (no data is not 0)."""
        self._trim(now)
        if not self._samples:
            return None
        return sum(value for _, value in self._samples) / len(self._samples)
