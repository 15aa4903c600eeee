"""Text-level stop strings, matched across chunk boundaries.

The engine matches ``stop_words`` as token sequences, but a string has several
spellings in tokens (byte-level BPE spells "User" after a space and after a
newline differently, and a tokenizer may merge it with what precedes it), so
some occurrences slip past the engine; matching the decoded text catches
every one. A stop string can arrive split over several tokens ("Us" + "er:"),
so the tail of the text that could still grow into one is held back; it is
released as soon as it no longer can. On a match the text before it is
emitted and the stop string itself never is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class StopResult:
    text: str
    stopped: bool = False


class StopStringMatcher:
    """One per request."""

    def __init__(self, stop_strings: Sequence[str]) -> None:
        self._stops = tuple(dict.fromkeys(s for s in stop_strings if s))
        # Every proper prefix of every stop string: the tails worth holding.
        self._prefixes = frozenset(s[:i] for s in self._stops for i in range(1, len(s)))
        self._longest_prefix = max((len(s) - 1 for s in self._stops), default=0)
        self._held = ""
        self._stopped = False

    @property
    def stopped(self) -> bool:
        return self._stopped

    def push(self, text: str) -> StopResult:
        if self._stopped:
            return StopResult("", stopped=True)
        if not self._stops:
            return StopResult(text)
        buffer = self._held + text
        match = self._earliest_match(buffer)
        if match is not None:
            self._held = ""
            self._stopped = True
            return StopResult(buffer[:match], stopped=True)
        hold = self._holdable_tail(buffer)
        self._held = buffer[len(buffer) - hold :] if hold else ""
        return StopResult(buffer[: len(buffer) - hold])

    def flush(self) -> StopResult:
        """End of stream: a held partial match was not a stop after all."""
        held, self._held = self._held, ""
        return StopResult("" if self._stopped else held, stopped=self._stopped)

    def _earliest_match(self, buffer: str) -> int | None:
        positions = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        return min(positions) if positions else None

    def _holdable_tail(self, buffer: str) -> int:
        for length in range(min(self._longest_prefix, len(buffer)), 0, -1):
            if buffer[-length:] in self._prefixes:
                return length
        return 0
