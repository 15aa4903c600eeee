"""The streams' bound under pacing: the ratio that prefill pacing uses,
steered so that the *tail* of the paced steps stays within `bound` x the
decode-only step measured before.

A fixed `prefill_time_ratio` aims the median paced step at (1 + ratio) x a
decode step, but the streams are judged on their inter-token p99, and on a
shared machine identical steps spread by 10-45% (other tenants): one ratio
keeps the tail in bound on a noisy machine and wastes the prompt's share on
a quiet one, or the reverse. So each paced step reports its spread
(`observe`): its time over the time it was paced for, (1 + ratio) x the
decode step, or more where pacing's floor (MIN_CHUNK_TOKENS, one layer)
bought more than the ratio; steps paced at other ratios still tell how far
the tail strays, and a floor that the ratio cannot lower is not taken for
noise. Every ADJUST_EVERY reports, (1 + ratio) moves toward MARGIN x bound
over the TAIL quantile of the last WINDOW spreads (half the way in log
terms, so that one noisy window does not swing it), within [MIN_RATIO,
bound - 1]. It starts from the configured ratio and keeps what it learned
for the next long prompt.
"""
from __future__ import annotations

import math
from collections import deque

WINDOW = 64          # paced steps the tail is read from
TAIL = 0.95          # ~the 4th largest of 64
ADJUST_EVERY = 8     # paced steps between adjustments
MARGIN = 0.9         # the window's tail is aimed this far inside the bound: a run's p99 sits above it
MIN_RATIO = 0.25     # the prompt keeps a share, however noisy the machine


class StepBound:
    def __init__(self, bound: float, ratio: float) -> None:
        if bound <= 1.0:
            raise ValueError(f"bound must be > 1 (a multiple of the decode step), got {bound}")
        self.bound = bound
        self.max_ratio = bound - 1.0           # a median step past the bound has no room for noise at all
        self.ratio = min(max(ratio, MIN_RATIO), self.max_ratio)
        self._spreads: deque[float] = deque(maxlen=WINDOW)
        self._since_adjust = 0

    def observe(self, spread: float) -> float:
        """A paced step took `spread` x what it was paced for: the ratio for
        the next steps."""
        self._spreads.append(spread)
        self._since_adjust += 1
        if self._since_adjust >= ADJUST_EVERY:
            self._since_adjust = 0
            self._adjust()
        return self.ratio

    def tail_spread(self) -> float:
        """The TAIL quantile of the window's spreads."""
        ordered = sorted(self._spreads)
        return ordered[min(len(ordered) - 1, int(TAIL * len(ordered)))]

    def _adjust(self) -> None:
        spread = self.tail_spread()
        if spread <= 0:
            return
        wanted = MARGIN * self.bound / spread
        self.ratio = min(max(math.sqrt((1.0 + self.ratio) * wanted) - 1.0, MIN_RATIO), self.max_ratio)
