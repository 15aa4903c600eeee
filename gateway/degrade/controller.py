"""The degradation level as a function of the signals over time: one step up
once some signal's window value has stayed above its enter threshold for the
enter dwell, one step down once every signal has stayed at or below its
exit threshold for the exit dwell, both counted from the last change at the
earliest (each step waits a full dwell of its own).

Hysteresis: a value between a signal's exit and enter thresholds neither
raises the level nor lets it fall, so a signal oscillating around one
threshold cannot make the level flap. No data (None) is not overload: it
starts no climb and holds no level up.

Pure state: time comes in as `now`, the caller (degradation.py) logs,
counts and publishes the changes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .signals import SignalValues

RECOVERED = "recovered"  # the cause of a step down


@dataclass(frozen=True)
class Threshold:
    signal: str
    enter: float
    exit: float

    def __post_init__(self) -> None:
        if self.exit < 0 or self.enter < 0:
            raise ValueError(
                f"degradation signal {self.signal}: thresholds must not be negative "
                f"(enter {self.enter}, exit {self.exit})"
            )
        if self.exit > self.enter:
            raise ValueError(
                f"degradation signal {self.signal}: the exit threshold ({self.exit}) must not exceed "
                f"the enter threshold ({self.enter}), or the level could never settle"
            )


@dataclass(frozen=True)
class Change:
    before: int
    after: int
    cause: str  # the signal that held above its enter threshold (up), or RECOVERED (down)
    held_s: float  # how long the condition had held
    values: SignalValues  # every signal's window value at the change

    @property
    def direction(self) -> str:
        return "up" if self.after > self.before else "down"


class Controller:
    def __init__(
        self, thresholds: Sequence[Threshold], max_level: int, enter_dwell_s: float, exit_dwell_s: float, now: float
    ) -> None:
        if enter_dwell_s < 0 or exit_dwell_s < 0:
            raise ValueError(
                f"degradation dwell times must not be negative (enter {enter_dwell_s} s, exit {exit_dwell_s} s)"
            )
        if max_level < 0:
            raise ValueError(f"the highest degradation level must not be negative (got {max_level})")
        self.thresholds = tuple(thresholds)
        self.max_level = max_level
        self.enter_dwell_s = enter_dwell_s
        self.exit_dwell_s = exit_dwell_s
        self.level = 0
        self.changed_at = now
        self._above_since: dict[str, float] = {}  # signal → since when above its enter threshold
        self._calm_since: float | None = None  # since when every signal is at or below its exit threshold

    def evaluate(self, values: SignalValues, now: float) -> Change | None:
        """The signals' window values now; the change of level they cause, if any."""
        calm = True
        for threshold in self.thresholds:
            value = values.get(threshold.signal)
            if value is not None and value > threshold.enter:
                self._above_since.setdefault(threshold.signal, now)
            else:
                self._above_since.pop(threshold.signal, None)
            if value is not None and value > threshold.exit:
                calm = False
        self._calm_since = (self._calm_since if self._calm_since is not None else now) if calm else None

        if self.level < self.max_level and self._above_since:
            # the signal above the longest is the cause
            signal, since = min(self._above_since.items(), key=lambda item: item[1])
            held = now - max(since, self.changed_at)
            if held >= self.enter_dwell_s:
                return self._step(+1, signal, now - since, values, now)
        if self.level > 0 and self._calm_since is not None:
            held = now - max(self._calm_since, self.changed_at)
            if held >= self.exit_dwell_s:
                return self._step(-1, RECOVERED, now - self._calm_since, values, now)
        return None

    def _step(self, step: int, cause: str, held_s: float, values: SignalValues, now: float) -> Change:
        change = Change(self.level, self.level + step, cause, held_s, dict(values))
        self.level += step
        self.changed_at = now
        return change

    def seconds_until_below(self, level: int, now: float) -> float:
        """The earliest the level can drop below `level`: one exit dwell per
        step down, the first counted from when the signals went calm (now, if
        they are not) or the last change, whichever is later. What a shed
        caller is told to wait (Retry-After)."""
        steps = self.level - level + 1
        if steps <= 0:
            return 0.0
        calm_since = self._calm_since if self._calm_since is not None else now
        first = max(calm_since, self.changed_at) + self.exit_dwell_s
        return max(0.0, first + (steps - 1) * self.exit_dwell_s - now)
