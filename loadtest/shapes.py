"""Load shapes: how many users run at each moment of a test."""

from __future__ import annotations

import math

from .settings import LoadSettings

# The burst occupies this window of the test (fractions of the duration).
BURST_WINDOW = (0.4, 0.6)


def users_at(settings: LoadSettings, elapsed_s: float) -> tuple[int, float] | None:
    """(user count, spawn rate) at `elapsed_s`, or None once the test is over.

    steady: `users` throughout. ramp: from 1 up to `users` over the first
    80% of the run, then hold. burst: `users` as the base load with a spike to
    `users * burst_factor` in the middle fifth, spawned as fast as possible.
    """
    if elapsed_s >= settings.duration_s:
        return None
    progress = elapsed_s / settings.duration_s
    if settings.shape == "steady":
        return settings.users, settings.spawn_rate
    if settings.shape == "ramp":
        users = 1 + math.floor((settings.users - 1) * min(1.0, progress / 0.8))
        return users, settings.spawn_rate
    peak = max(settings.users + 1, round(settings.users * settings.burst_factor))
    if BURST_WINDOW[0] <= progress < BURST_WINDOW[1]:
        return peak, float(peak)  # a spike arrives at once, not at the usual spawn rate
    return settings.users, float(peak)
