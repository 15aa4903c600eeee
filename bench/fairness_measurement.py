"""What one point of the fairness bench (`bench/fairness.py`) measured,
and its summary: the two targets, the control, the pacer's margin and the
terms of the long prompt's TTFT (`fairness_terms.py`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from .fairness_report import ITL_P99_LIMIT, TTFT_LIMIT
from .fairness_terms import step_terms


@dataclass
class Measurement:
    label: str
    config: dict[str, Any]
    load_before: float
    long_tokens: int = 0
    ttft_alone_s: float = 0.0
    alone_steps: list[tuple[int, int, float]] = field(default_factory=list)  # (start, tokens, seconds)
    itl_before_s: list[float] = field(default_factory=list)
    itl_during_s: list[float] = field(default_factory=list)
    # the control: the same streams and steps without the long prompt
    itl_control_before_s: list[float] = field(default_factory=list)
    itl_control_s: list[float] = field(default_factory=list)
    ttft_s: float = 0.0
    # (long's start, its tokens, step s, the layers its chunk ran: fewer than
    # the model's in a layer slice)
    during_steps: list[tuple[int, int, float, int]] = field(default_factory=list)
    # the pacer's margin as each of those steps was planned (none: no pacer)
    margins: list[float] = field(default_factory=list)
    # the pacer's decode-only step as the long prompt arrived: its aim's base,
    # to tell against the streams' own ITL p50 before (None: no pacer)
    pacer_decode_s: float | None = None
    # per step of the long prompt: the seconds the pacer planned it to take,
    # and the runner's own seconds of its layer slice (None: not paced / no slice)
    aims: list[float | None] = field(default_factory=list)
    slice_own_s: list[float | None] = field(default_factory=list)
    cores_used: float = 0.0
    num_layers: int = 0

    def summary(self, best_alone_s: float) -> dict[str, Any]:
        p50_before = statistics.median(self.itl_before_s)
        p99_during = percentile(self.itl_during_s, 99)
        out: dict[str, Any] = {
            "label": self.label,
            "config": self.config,
            "long_tokens": self.long_tokens,
            "load_before": round(self.load_before, 2),
            "cores_used": round(self.cores_used, 2),
            "itl_p50_before_ms": 1e3 * p50_before,
            "itl_p50_during_ms": 1e3 * statistics.median(self.itl_during_s),
            "itl_p99_during_ms": 1e3 * p99_during,
            "itl_max_during_ms": 1e3 * max(self.itl_during_s),
            "itl_p99_over_p50_before": p99_during / p50_before,
            "itl_p99_control_ms": 1e3 * percentile(self.itl_control_s, 99),
            "itl_p99_control_over_p50_before": (
                percentile(self.itl_control_s, 99) / statistics.median(self.itl_control_before_s)
            ),
            "ttft_s": self.ttft_s,
            "ttft_alone_s": self.ttft_alone_s,
            "ttft_over_alone": self.ttft_s / self.ttft_alone_s,
            "ttft_over_best_alone": self.ttft_s / best_alone_s,
            "steps_during": len(self.during_steps),
            "steps_alone": len(self.alone_steps),
            "sliced_steps_during": sum(1 for *_, layers in self.during_steps if 0 < layers < self.num_layers),
            "margin_p50": statistics.median(self.margins) if self.margins else None,
            "margin_max": max(self.margins) if self.margins else None,
            "pacer_decode_ms": None if self.pacer_decode_s is None else 1e3 * self.pacer_decode_s,
            "pacer_decode_over_p50_before": (None if self.pacer_decode_s is None else self.pacer_decode_s / p50_before),
            "itl_before_ms": [1e3 * gap for gap in self.itl_before_s],
            **step_terms(self.during_steps, self.aims, self.slice_own_s, self.alone_steps, self.num_layers),
            "alone_steps": self.alone_steps,
            "during_steps": self.during_steps,
            "aims": self.aims,
            "slice_own_s": self.slice_own_s,
        }
        out["meets_itl"] = out["itl_p99_over_p50_before"] <= ITL_P99_LIMIT
        out["meets_ttft"] = out["ttft_over_alone"] <= TTFT_LIMIT
        out["meets_ttft_best"] = out["ttft_over_best_alone"] <= TTFT_LIMIT
        return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
