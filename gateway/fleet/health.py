"""A replica's health: probe results and passive signals (consecutive
upstream errors or stalls) move it between routable and ejected.

Ejection needs `eject_after_failures` consecutive failures; an ejected
replica comes back after `readmit_after_successes` consecutive good probes,
and not before its ejection's minimum length, which doubles with every
ejection in a row (a flapping replica stays out longer each time) up to a
ceiling. The fleet never ejects its last routable replica (fleet.py asks
`may_eject` first): a degraded answer beats none."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

MAX_EJECTION_S = 300.0


@dataclass
class Health:
    eject_after_failures: int
    readmit_after_successes: int
    backoff_s: float
    clock: Callable[[], float] = time.monotonic
    ejected: bool = False
    proven: bool = False  # one good inference probe since it was added
    failures: int = 0  # consecutive
    successes: int = 0  # consecutive, while ejected
    ejections: int = 0  # in a row: reset by a clean stretch after re-admission
    ejected_until: float = 0.0
    last_reason: str = ""
    history: list[str] = field(default_factory=list)

    def failed(self, reason: str, may_eject: bool, decisive: bool = False) -> bool:
        """Record a failure; True when it ejects the replica now. A decisive
        one (a wrong answer to the probe: its greedy tokens win by wide
        margins, so no healthy replica gives another) ejects at once."""
        self.failures = max(self.failures + 1, self.eject_after_failures if decisive else 0)
        self.successes = 0
        self.last_reason = reason
        if self.ejected or self.failures < self.eject_after_failures or not may_eject:
            return False
        self.ejected = True
        self.ejected_until = self.clock() + min(self.backoff_s * 2**self.ejections, MAX_EJECTION_S)
        self.ejections += 1
        self.history.append(f"ejected: {reason}")
        return True

    def succeeded(self) -> bool:
        """Record a good probe; True when it re-admits the replica now."""
        self.failures = 0
        self.proven = True
        if not self.ejected:
            if self.successes >= self.readmit_after_successes:
                self.ejections = 0  # a clean stretch: the next ejection starts short again
            self.successes += 1
            return False
        self.successes += 1
        if self.successes < self.readmit_after_successes or self.clock() < self.ejected_until:
            return False
        self.ejected = False
        self.successes = 0
        self.history.append("re-admitted")
        return True
