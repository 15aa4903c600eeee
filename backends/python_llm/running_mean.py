"""The adapter's running means of a round trip's time (a response's send, a
cancel check), which its budgets divide by a share of the engine thread."""

from __future__ import annotations

# weight of the newest sample: a few steps' worth of 64 streams
SMOOTHING = 0.05


def running_mean(mean: float, sample: float) -> float:
    """`mean` moved towards `sample`; the first sample (mean 0) is taken whole."""
    return sample if mean == 0.0 else mean + SMOOTHING * (sample - mean)
