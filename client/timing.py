"""Client-side latency bookkeeping, measured the way genai-perf and AIPerf do.

TTFT: request sent -> first non-empty response. ITL: gaps between consecutive
non-empty responses. TPOT: (e2e - TTFT) / (output tokens - 1).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

Clock = Callable[[], float]
DEFAULT_CLOCK: Clock = time.perf_counter


def compute_tpot(e2e_s: float | None, ttft_s: float | None, output_tokens: int) -> float | None:
    """Time per output token after the first; None when it is undefined."""
    if e2e_s is None or ttft_s is None or output_tokens < 2:
        return None
    return (e2e_s - ttft_s) / (output_tokens - 1)


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in zip(times, times[1:])]


@dataclass
class Timings:
    """Arrival times (seconds on one monotonic clock) of one request's responses."""

    sent_s: float
    response_times_s: list[float] = field(default_factory=list)
    token_times_s: list[float] = field(default_factory=list)
    finished_s: float | None = None

    def record_response(self, at_s: float, carries_tokens: bool) -> None:
        self.response_times_s.append(at_s)
        if carries_tokens:
            self.token_times_s.append(at_s)

    def finish(self, at_s: float) -> None:
        if self.finished_s is None:
            self.finished_s = at_s

    @property
    def ttft_s(self) -> float | None:
        return self.token_times_s[0] - self.sent_s if self.token_times_s else None

    @property
    def e2e_s(self) -> float | None:
        return None if self.finished_s is None else self.finished_s - self.sent_s

    @property
    def chunk_gaps_s(self) -> list[float]:
        """Gaps between every pair of consecutive responses, empty ones included."""
        return gaps(self.response_times_s)

    @property
    def itl_s(self) -> list[float]:
        """Inter-token latencies: one sample per gap between responses with tokens."""
        return gaps(self.token_times_s)

    def tpot_s(self, output_tokens: int) -> float | None:
        return compute_tpot(self.e2e_s, self.ttft_s, output_tokens)
