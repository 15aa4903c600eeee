"""Engine metrics: the families of the contract (docs/interface.md, "Engine
metrics"; their names are contract/metric_names.py's) and a small sink
interface. The engine only talks to a MetricsSink; the Triton adapter
subclasses it with pb_utils families, tests use InMemoryMetrics. The base
class is a no-op sink."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from contract.metric_names import (
    BATCH_SIZE,
    E2E_REQUEST_LATENCY,
    GENERATION_TOKENS,
    INTER_TOKEN_LATENCY,
    KV_BLOCKS_CAPACITY,
    KV_BLOCKS_USED,
    PREEMPTIONS,
    PREFIX_CACHE_HIT_TOKENS,
    PROMPT_TOKENS,
    REQUEST_QUEUE_TIME,
    REQUESTS_CANCELLED,
    REQUESTS_REJECTED,
    REQUESTS_RUNNING,
    REQUESTS_TIMED_OUT,
    REQUESTS_WAITING,
    TIME_PER_OUTPUT_TOKEN,
    TIME_TO_FIRST_TOKEN,
)

MetricKind = Literal["counter", "gauge", "histogram"]

# 1 ms .. 60 s, roughly 1-2.5-5 per decade (what vLLM's latency histograms use)
LATENCY_BUCKETS: tuple[float, ...] = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    60.0,
)
# fine-grained at small sizes: CPU deployments run few sequences per step
BATCH_SIZE_BUCKETS: tuple[float, ...] = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)


@dataclass(frozen=True)
class MetricFamily:
    name: str
    kind: MetricKind
    description: str
    buckets: tuple[float, ...] = ()


METRIC_FAMILIES: tuple[MetricFamily, ...] = (
    MetricFamily(KV_BLOCKS_USED, "gauge", "KV cache blocks in use"),
    MetricFamily(KV_BLOCKS_CAPACITY, "gauge", "KV cache blocks allocated in total"),
    MetricFamily(REQUESTS_RUNNING, "gauge", "Requests in the running batch"),
    MetricFamily(REQUESTS_WAITING, "gauge", "Requests waiting to be scheduled"),
    MetricFamily(BATCH_SIZE, "histogram", "Sequences per engine step", BATCH_SIZE_BUCKETS),
    MetricFamily(PROMPT_TOKENS, "counter", "Prompt tokens of admitted requests"),
    MetricFamily(GENERATION_TOKENS, "counter", "Tokens generated"),
    MetricFamily(PREFIX_CACHE_HIT_TOKENS, "counter", "Prompt tokens served from the prefix cache"),
    MetricFamily(PREEMPTIONS, "counter", "Requests preempted (recomputed later) for lack of KV blocks"),
    MetricFamily(REQUESTS_CANCELLED, "counter", "Requests cancelled by the client"),
    MetricFamily(REQUESTS_TIMED_OUT, "counter", "Requests ended by the per-token timeout"),
    MetricFamily(REQUESTS_REJECTED, "counter", "Requests rejected because the waiting queue was full"),
    MetricFamily(TIME_TO_FIRST_TOKEN, "histogram", "Arrival to first token (s)", LATENCY_BUCKETS),
    MetricFamily(INTER_TOKEN_LATENCY, "histogram", "Gap between consecutive tokens (s)", LATENCY_BUCKETS),
    MetricFamily(
        TIME_PER_OUTPUT_TOKEN,
        "histogram",
        "Per finished request: (e2e latency - TTFT) / (output tokens - 1) (s)",
        LATENCY_BUCKETS,
    ),
    MetricFamily(REQUEST_QUEUE_TIME, "histogram", "Arrival to first scheduled (s)", LATENCY_BUCKETS),
    MetricFamily(E2E_REQUEST_LATENCY, "histogram", "Arrival to finish (s)", LATENCY_BUCKETS),
)
METRIC_KINDS: dict[str, MetricKind] = {family.name: family.kind for family in METRIC_FAMILIES}


class MetricsSink:
    """Where the engine reports. Every method is called from the engine loop
    thread, except the rejection counter (called from add_request's thread)."""

    def counter_add(self, name: str, value: float) -> None:
        pass

    def gauge_set(self, name: str, value: float) -> None:
        pass

    def histogram_observe(self, name: str, value: float) -> None:
        pass

    def histogram_observe_many(self, name: str, values: Iterable[float]) -> None:
        """One call per step for per-token series (ITL); a sink whose observe
        is costly can override this to batch."""
        for value in values:
            self.histogram_observe(name, value)


class InMemoryMetrics(MetricsSink):
    """Keeps every value, and rejects names or kinds outside the contract so a
    typo fails a test instead of silently creating a new series."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, float] = {}
        self._gauges: dict[str, float] = {}
        self._histograms: dict[str, list[float]] = {}

    @staticmethod
    def _check(name: str, kind: MetricKind) -> None:
        actual = METRIC_KINDS.get(name)
        if actual != kind:
            raise ValueError(f"metric {name!r}: not a {kind} of the contract (found {actual})")

    def counter_add(self, name: str, value: float) -> None:
        self._check(name, "counter")
        if value < 0:
            raise ValueError(f"metric {name!r}: counters only go up, got {value}")
        with self._lock:
            self._counters[name] = self._counters.get(name, 0.0) + value

    def gauge_set(self, name: str, value: float) -> None:
        self._check(name, "gauge")
        with self._lock:
            self._gauges[name] = value

    def histogram_observe(self, name: str, value: float) -> None:
        self._check(name, "histogram")
        with self._lock:
            self._histograms.setdefault(name, []).append(value)

    def histogram_observe_many(self, name: str, values: Iterable[float]) -> None:
        self._check(name, "histogram")
        with self._lock:
            self._histograms.setdefault(name, []).extend(values)

    def counter(self, name: str) -> float:
        with self._lock:
            return self._counters.get(name, 0.0)

    def gauge(self, name: str) -> float | None:
        with self._lock:
            return self._gauges.get(name)

    def observations(self, name: str) -> list[float]:
        with self._lock:
            return list(self._histograms.get(name, ()))
