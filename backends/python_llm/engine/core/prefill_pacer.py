"""Prefill pacing: how much prompt a step may carry while streams decode.

A fixed token budget cannot keep decodes smooth under a long prompt: the
cost of a prefill token grows with its position (its attention reads every
earlier token; at 8k tokens of context on SmolLM2 a token's attention is
~2.7x its GEMMs), and what a decode step costs differs by machine, load and
batch. So while decodes run, a step's prefill chunks are bounded in *time*:
the streams' inter-token latency stays within (1 + ratio) x a decode-only
step now, at its p99. Each paced step is planned at that bound divided by
a margin, from how far steps have run over their plans lately
(`step_spread.py`: the p99 of recent paced steps' seconds over their plan,
and of decode-only steps' over their median; SPREAD_SAFETY times its
excess, at most MAX_MARGIN), so that the bound holds at the tail, not on
average, and the prompt gets what the machine's noise leaves it: a quiet
machine plans near the bound, a noisy one further below.

Cost model: a prefill token at position p costs 1 + p / C "units", C (the
model's `attention_parity_context`) the context at which a token's
attention FLOPs equal its GEMM FLOPs; a chunk of n tokens from `start` costs
n * (1 + (start + (n + 1) / 2) / C). Estimates, from the steps themselves:
seconds of a decode-only step, one per power-of-two bucket of decode
counts (16 decodes cost more than 1), the median of the bucket's last
DECODE_WINDOW steps (one stall just before a long prompt arrives, a full
garbage collection say, must not raise every step's aim for the whole
prompt); and seconds per unit of prefill, a running average (a mixed
step's time less the decode-only estimate, over its units; steps without
decodes teach nothing: their chunks are bigger and cheaper per
token). While only the decode step is known, a mixed step carries a small
probe of PROBE_UNITS. No limit before a decode-only step was seen, nor for a step
without decodes (a prompt alone runs at the full token budget).
`max_num_batched_tokens` still applies.

A paced chunk that cannot finish the prompt runs a few of its layers a
step instead (`layer_slices.py`), priced with the same units.
"""

from __future__ import annotations

import math
import statistics
from collections import deque

from .step_spread import StepSpread

MIN_CHUNK_TOKENS = 8  # progress whatever the estimates say
SMOOTHING = 0.25  # weight of the newest step in the running averages
PROBE_UNITS = 32.0  # a mixed step's prefill while the cost of a unit is unknown
# decode-only steps whose median is a bucket's decode step: an EMA let one
# 54 ms collection before an 8k prompt raise the aim a quarter of it, 37 ->
# 50 ms, and the streams' ITL p99 during the prompt to 4.0x their p50
# (docs/benchmarks.md, "Issue 18 on the AMX machine: the pacer plans below
# the bound by the steps' spread")
DECODE_WINDOW = 9
# the bound holds at this quantile of steps: the streams' ITL p99
BOUND_QUANTILE = 0.99
# recent steps whose spread over their plan sets the margin (an 8k prompt
# beside 16 streams took ~280 paced steps on a 2-core machine)
SPREAD_WINDOW = 128
# paced steps before their own spread counts; until then the decode-only
# steps' (the machine's noise alone, without the pacer's estimation error)
MIN_PACED_SAMPLES = 16
# the margin is this many times the spread's excess over 1 (1.08 -> 1.12):
# the p99 of the last steps underestimates the p99 of a prompt's steps to
# come, the more so the noisier the machine: planned at the spread itself,
# the ITL p99 passed a 3x bound in 5 runs of 11 (3.00-3.32x), the steps up
# to 9% over their margin; at 1.5 both of issue 18's targets held in 6 of 6
# (docs/benchmarks.md, the section named above)
SPREAD_SAFETY = 1.5
# the most a step is planned below the bound: spread that wide is not noise
# but a change of load, which the estimates follow anyway
MAX_MARGIN = 1.5
# a mixed step's prefill share is taken as at least this part of its time: a
# step that ran faster than the decode estimate (noise) must not make prefill
# look free, which would let the next step's chunk grow without bound
MIN_PREFILL_SHARE = 0.25


class PrefillPacer:
    def __init__(
        self,
        ratio: float,
        attention_context: float = 0.0,
        min_tokens: int = MIN_CHUNK_TOKENS,
        smoothing: float = SMOOTHING,
    ) -> None:
        self.ratio = ratio
        # 0 / unknown: every prefill token costs the same
        self.attention_context = attention_context if attention_context > 0 else math.inf
        self.min_tokens = min_tokens
        self.smoothing = smoothing
        self._decode_steps: dict[int, deque[float]] = {}  # bucket of decode counts -> its last steps' seconds
        self._decode_s: dict[int, float] = {}  # bucket -> their median
        self.unit_s: float | None = None  # one unit of prefill
        self._decode_spread = StepSpread(SPREAD_WINDOW, BOUND_QUANTILE)  # over the bucket's median
        self._paced_spread = StepSpread(SPREAD_WINDOW, BOUND_QUANTILE)  # over the step's aim

    @staticmethod
    def _bucket(num_decodes: int) -> int:
        return num_decodes.bit_length()  # 1 | 2-3 | 4-7 | 8-15 | ...

    def decode_step_s(self, num_decodes: int) -> float | None:
        """A decode-only step of `num_decodes` now: its bucket's median, else the nearest bucket's."""
        if not self._decode_s:
            return None
        bucket = self._bucket(num_decodes)
        found = self._decode_s.get(bucket)
        if found is not None:
            return found
        return self._decode_s[min(self._decode_s, key=lambda b: (abs(b - bucket), b))]

    @property
    def enabled(self) -> bool:
        return self.ratio > 0

    def cost(self, start: int, num_tokens: int) -> float:
        """Units of a chunk of `num_tokens` prompt tokens from position `start`."""
        return num_tokens * (1.0 + (start + (num_tokens + 1) / 2) / self.attention_context)

    def max_tokens(self, start: int, units: float) -> int:
        """The largest chunk from `start` that costs at most `units` (>= 0)."""
        units *= 1.0 + 1e-9  # a budget computed as 9.999999... units still buys 10
        c = self.attention_context
        if math.isinf(c):
            return int(units)
        # n^2 / (2c) + n (1 + (start + 1/2) / c) - units <= 0
        b = 1.0 + (start + 0.5) / c
        n = max(int(c * (math.sqrt(b * b + 2.0 * units / c) - b)), 0)
        while n > 0 and self.cost(start, n) > units:  # floating point at the boundary
            n -= 1
        while self.cost(start, n + 1) <= units:
            n += 1
        return n

    def margin(self) -> float:
        """How far below the bound a paced step is planned (>= 1)."""
        spread = self._decode_spread.value()
        if len(self._paced_spread) >= MIN_PACED_SAMPLES:
            spread = max(spread, self._paced_spread.value())
        return min(1.0 + SPREAD_SAFETY * max(spread - 1.0, 0.0), MAX_MARGIN)

    def aim_s(self, num_decodes: int) -> float | None:
        """Seconds a paced step of `num_decodes` is planned to take; None = no limit."""
        decode_s = self.decode_step_s(num_decodes) if self.enabled and num_decodes else None
        if decode_s is None:
            return None
        return (1.0 + self.ratio) * decode_s / self.margin()

    def plan(self, num_decodes: int) -> tuple[float | None, float | None]:
        """(units of prefill, seconds) the next step is planned to carry and
        take; None = no limit. A probe's seconds are None: it is not planned
        to the aim."""
        aim_s = self.aim_s(num_decodes)
        decode_s = self.decode_step_s(num_decodes)  # known where aim_s is
        if aim_s is None or decode_s is None:
            return None, None
        if self.unit_s is None:
            return PROBE_UNITS, None
        return max(aim_s - decode_s, 0.0) / self.unit_s, aim_s

    def observe(self, seconds: float, num_decodes: int, prefill_units: float, aim_s: float | None = None) -> None:
        """A finished step: its wall time, its decodes, its prefill units, and
        what it was planned to take (`plan()`), where all its prefill kept
        to the plan. Not so a short prompt's chunk (pacing does not cut it),
        nor one at the least progress allowed (MIN_CHUNK_TOKENS, one layer):
        such a step does not tell how planned steps keep to their plan, and
        counting it would feed back (a lower aim, the same floor, a wider
        spread)."""
        if not self.enabled or seconds <= 0:
            return
        if not num_decodes:
            return  # a prompt alone: no decodes to pace for (and its fixed cost is not a prefill's)
        if prefill_units <= 0:
            bucket = self._bucket(num_decodes)
            steps = self._decode_steps.setdefault(bucket, deque(maxlen=DECODE_WINDOW))
            steps.append(seconds)
            median = self._decode_s[bucket] = statistics.median(steps)
            self._decode_spread.add(seconds, median)
            return
        base = self.decode_step_s(num_decodes)
        if base is None:
            return  # cannot tell the prefill's share yet
        if aim_s is not None:
            self._paced_spread.add(seconds, aim_s)
        share = max(seconds - base, MIN_PREFILL_SHARE * seconds)
        self.unit_s = self._average(self.unit_s, share / prefill_units)

    def _average(self, current: float | None, sample: float) -> float:
        return sample if current is None else current + self.smoothing * (sample - current)
