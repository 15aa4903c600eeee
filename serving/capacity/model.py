"""The planner's inputs and its arithmetic, without I/O.

Demand is output tokens per second at peak (QPS × mean output tokens). A
replica's capacity is its measured output tokens/s at the largest
concurrency that still meets the SLO (TTFT p90, time per output token): with
continuous batching that is far more than one request's speed, which is what
a naive plan divides by. Little's law gives the concurrency the peak needs
(QPS × mean request latency); a replica holds at most the SLO-meeting
concurrency. Replicas = the larger of the two needs at the target
utilisation, then redundancy (N + k, or 2N), and at least `min_replicas`
for availability. GPUs = replicas × GPUs per replica (TP × PP)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass


class PlanError(ValueError):
    """Bad planner input; the message names the option."""


@dataclass(frozen=True)
class Measurement:
    """A replica measured at one concurrency (requests in flight)."""

    concurrency: int
    output_tokens_per_s: float  # the whole replica's, all streams together
    ttft_p90_s: float | None = None
    tpot_s: float | None = None  # per stream; None: concurrency / throughput

    @property
    def time_per_output_token_s(self) -> float:
        return self.tpot_s if self.tpot_s is not None else self.concurrency / self.output_tokens_per_s


@dataclass(frozen=True)
class Redundancy:
    """N + k spare replicas, or `double` (2N: a whole second fleet)."""

    spare: int = 1
    double: bool = False

    @classmethod
    def parse(cls, text: str) -> Redundancy:
        cleaned = text.replace(" ", "").upper()
        if cleaned == "2N":
            return cls(0, True)
        match = re.fullmatch(r"(?:N\+)?(\d+)", cleaned)
        if not match:
            raise PlanError(f"--redundancy: N+k (e.g. N+1), k, or 2N; got {text!r}")
        return cls(int(match.group(1)))

    def apply(self, needed: int) -> int:
        return 2 * needed if self.double else needed + self.spare

    def __str__(self) -> str:
        return "2N" if self.double else f"N+{self.spare}"


@dataclass(frozen=True)
class PlanInput:
    peak_qps: float
    mean_output_tokens: float
    mean_input_tokens: float = 0.0
    measurements: tuple[Measurement, ...] = ()
    ttft_p90_slo_s: float | None = None
    tpot_slo_s: float | None = None
    redundancy: Redundancy = Redundancy()
    max_utilisation: float = 1.0  # plan for at most this fraction of measured capacity at peak
    min_replicas: int = 2
    gpus_per_replica: int = 1  # TP × PP

    def __post_init__(self) -> None:
        for name in ("peak_qps", "mean_output_tokens"):
            if not getattr(self, name) > 0:
                raise PlanError(f"--{name.replace('_', '-')}: must be > 0, got {getattr(self, name)}")
        if self.mean_input_tokens < 0:
            raise PlanError(f"--mean-input-tokens: must be >= 0, got {self.mean_input_tokens}")
        if not 0 < self.max_utilisation <= 1:
            raise PlanError(f"--max-utilisation: in (0, 1], got {self.max_utilisation}")
        if self.min_replicas < 1 or self.gpus_per_replica < 1:
            raise PlanError("--min-replicas and --gpus-per-replica: at least 1")
        if not self.measurements:
            raise PlanError("--throughput or --bench-json: at least one measured concurrency")
        for m in self.measurements:
            if m.concurrency < 1 or not m.output_tokens_per_s > 0:
                raise PlanError(f"--throughput: concurrency >= 1 and tokens/s > 0, got {m}")


@dataclass(frozen=True)
class Plan:
    demand_tokens_per_s: float
    single_stream_tokens_per_s: float
    naive_replicas: int  # one request at a time per replica
    operating_point: Measurement  # the largest SLO-meeting throughput
    mean_latency_s: float
    concurrency_needed: float  # Little's law at peak
    replicas_for_throughput: int
    replicas_for_concurrency: int
    replicas_needed: int  # N: the peak at the target utilisation
    replicas: int  # with redundancy and the availability floor
    gpus: int
    rejected: tuple[tuple[Measurement, str], ...]  # points that miss the SLO, and why


def meets_slo(m: Measurement, plan: PlanInput) -> str | None:
    """Why `m` misses the SLO, or None."""
    if plan.tpot_slo_s is not None and m.time_per_output_token_s > plan.tpot_slo_s:
        return f"TPOT {m.time_per_output_token_s * 1000:.0f} ms > {plan.tpot_slo_s * 1000:.0f} ms"
    if plan.ttft_p90_slo_s is not None and m.ttft_p90_s is not None and m.ttft_p90_s > plan.ttft_p90_slo_s:
        return f"TTFT p90 {m.ttft_p90_s:.2f} s > {plan.ttft_p90_slo_s:.2f} s"
    return None


def make_plan(plan: PlanInput) -> Plan:
    demand = plan.peak_qps * plan.mean_output_tokens
    by_concurrency = sorted(plan.measurements, key=lambda m: m.concurrency)
    single = by_concurrency[0]
    single_speed = single.output_tokens_per_s / single.concurrency
    rejected = tuple((m, why) for m in by_concurrency if (why := meets_slo(m, plan)) is not None)
    meeting = [m for m in by_concurrency if meets_slo(m, plan) is None]
    if not meeting:
        raise PlanError(
            "no measured concurrency meets the SLO: "
            + "; ".join(f"c={m.concurrency}: {why}" for m, why in rejected)
            + " (a replica cannot serve it at any load)"
        )
    point = max(meeting, key=lambda m: m.output_tokens_per_s)
    latency = (point.ttft_p90_s or 0.0) + plan.mean_output_tokens * point.time_per_output_token_s
    concurrency = plan.peak_qps * latency
    usable = point.output_tokens_per_s * plan.max_utilisation
    for_throughput = math.ceil(demand / usable - 1e-9)
    for_concurrency = math.ceil(concurrency / (point.concurrency * plan.max_utilisation) - 1e-9)
    needed = max(for_throughput, for_concurrency, 1)
    replicas = max(plan.redundancy.apply(needed), plan.min_replicas)
    return Plan(
        demand,
        single_speed,
        math.ceil(demand / single_speed - 1e-9),
        point,
        latency,
        concurrency,
        for_throughput,
        for_concurrency,
        needed,
        replicas,
        replicas * plan.gpus_per_replica,
        rejected,
    )
