"""What happened between two consecutive scrapes: counter and histogram
deltas turned into rates, means and quantiles (Prometheus'
`histogram_quantile`: linear within the bucket)."""

from __future__ import annotations

from dataclasses import dataclass

from contract import metric_names as m

from .trace import Sample

ITL = m.INTER_TOKEN_LATENCY
BATCH = m.BATCH_SIZE


@dataclass(frozen=True)
class Interval:
    start: float
    seconds: float
    waiting: float  # gauges: the mean of the two ends
    running: float
    kv_use: float  # blocks used / capacity, the later end
    steps: float  # engine steps
    mean_batch: float | None  # sequences per step; None: no step
    prompt_tokens: float  # admitted in the interval
    generated_tokens: float
    preemptions: float
    rejections: float
    itl_p50_s: float | None
    itl_p99_s: float | None
    itl_count: float

    @property
    def end(self) -> float:
        return self.start + self.seconds


def _delta(a: Sample, b: Sample, name: str) -> float:
    # a counter that went down: the server restarted; count from zero
    before, after = a.get(name), b.get(name)
    return after - before if after >= before else after


def quantile(q: float, a: Sample, b: Sample, histogram: str) -> float | None:
    before = dict(a.buckets(histogram))
    deltas = [(le, count - before.get(le, 0.0)) for le, count in b.buckets(histogram)]
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    rank, lower, previous = q * total, 0.0, 0.0
    for le, cumulative in deltas:
        if cumulative >= rank:
            if le == float("inf"):
                return lower  # past the last finite bound: its bound, as Prometheus does
            share = (rank - previous) / (cumulative - previous) if cumulative > previous else 1.0
            return lower + (le - lower) * share
        lower, previous = le, cumulative
    return lower


def intervals(samples: list[Sample]) -> list[Interval]:
    out = []
    for a, b in zip(samples, samples[1:]):
        seconds = b.t - a.t
        if seconds <= 0:
            continue
        steps = _delta(a, b, f"{BATCH}_count")
        capacity = b.get(m.KV_BLOCKS_CAPACITY)
        out.append(
            Interval(
                start=a.t,
                seconds=seconds,
                waiting=(a.get(m.REQUESTS_WAITING) + b.get(m.REQUESTS_WAITING)) / 2,
                running=(a.get(m.REQUESTS_RUNNING) + b.get(m.REQUESTS_RUNNING)) / 2,
                kv_use=b.get(m.KV_BLOCKS_USED) / capacity if capacity > 0 else 0.0,
                steps=steps,
                mean_batch=_delta(a, b, f"{BATCH}_sum") / steps if steps > 0 else None,
                prompt_tokens=_delta(a, b, m.PROMPT_TOKENS),
                generated_tokens=_delta(a, b, m.GENERATION_TOKENS),
                preemptions=_delta(a, b, m.PREEMPTIONS),
                rejections=_delta(a, b, m.REQUESTS_REJECTED),
                itl_p50_s=quantile(0.5, a, b, ITL),
                itl_p99_s=quantile(0.99, a, b, ITL),
                itl_count=_delta(a, b, f"{ITL}_count"),
            )
        )
    return out
