"""How far steps run over what they were planned to take: a high quantile
of (a step's seconds / its plan) over a window of recent steps.

The prefill pacer (`prefill_pacer.py`) bounds the streams' inter-token
latency at a quantile (their p99), not on average: a step planned at
exactly the bound runs over it about half the time, by the machine's noise
(another process, a page fault, a cache miss storm) and by the pacer's own
estimation error (the cost model, a slice's layers rounded to whole ones).
So it plans each paced step at the bound divided by this spread.
"""

from __future__ import annotations

import math
from collections import deque


class StepSpread:
    def __init__(self, window: int, quantile: float) -> None:
        if not 0.0 < quantile <= 1.0:
            raise ValueError(f"quantile: {quantile} is not in (0, 1]")
        self.quantile = quantile
        self._ratios: deque[float] = deque(maxlen=window)
        self._value: float | None = None  # cached until the next sample

    def __len__(self) -> int:
        return len(self._ratios)

    def add(self, seconds: float, planned_s: float) -> None:
        if planned_s > 0.0 and seconds > 0.0:
            self._ratios.append(seconds / planned_s)
            self._value = None

    def value(self) -> float:
        """The window's `quantile` of seconds / plan: the sample at that rank
        (0.99 of 128 samples is the second highest), but never the highest
        of two or more. One stall is not a spread: before a long prompt the
        window holds a few dozen decode steps, and one step stalled 1.5x
        among them put every step of the prompt at MAX_MARGIN (TTFT 2.82x
        its time alone, where 1.8-1.9x was usual). 1.0 while empty."""
        if self._value is None:
            ordered = sorted(self._ratios)
            n = len(ordered)
            self._value = ordered[max(min(math.ceil(self.quantile * n), n - 1) - 1, 0)] if ordered else 1.0
        return self._value
