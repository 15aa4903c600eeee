"""A replica's load as its own metrics say it (the engine's waiting and
running requests, KV blocks used of capacity), scraped from its Prometheus
endpoint, and how fresh that reading is. A reading older than
`metrics_stale_s`, or none at all, counts as a saturated replica: the router
must not keep sending to a pod whose last metrics looked idle.

The same scrape also carries the engine's cumulative counters that the
degradation controller (gateway/degrade/) turns into rates over its window:
preemptions, and the queue-time histogram's sum and count (the mean queue
time of the requests scheduled in a window is Δsum / Δcount). They are raw
totals since the engine started: a restarted replica starts them at 0 again."""

from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from contract.metric_names import (
    KV_BLOCKS_CAPACITY,
    KV_BLOCKS_USED,
    PREEMPTIONS,
    REQUEST_QUEUE_TIME,
    REQUESTS_RUNNING,
    REQUESTS_WAITING,
)

# sample name → field; a gauge's sample is named like its family
_GAUGES = {
    REQUESTS_WAITING: "waiting",
    REQUESTS_RUNNING: "running",
    KV_BLOCKS_USED: "kv_used",
    KV_BLOCKS_CAPACITY: "kv_capacity",
}
_COUNTERS = {
    PREEMPTIONS: "preemptions",
    f"{REQUEST_QUEUE_TIME}_sum": "queue_time_sum",
    f"{REQUEST_QUEUE_TIME}_count": "queue_time_count",
}
_SAMPLES = {**_GAUGES, **_COUNTERS}
# the families holding them: the parser names a counter's family without its `_total`
_FAMILIES = frozenset({*_GAUGES, PREEMPTIONS, PREEMPTIONS.removesuffix("_total"), REQUEST_QUEUE_TIME})


@dataclass(frozen=True)
class LoadReading:
    waiting: float = 0.0
    running: float = 0.0
    kv_used: float = 0.0
    kv_capacity: float = 0.0
    # cumulative since the engine started (0 when the exposition lacks them)
    preemptions: float = 0.0
    queue_time_sum: float = 0.0  # seconds, over every request scheduled so far
    queue_time_count: float = 0.0
    at: float = 0.0  # time.monotonic() of the scrape; 0: never

    @property
    def kv_utilisation(self) -> float:
        return self.kv_used / self.kv_capacity if self.kv_capacity > 0 else 1.0

    def age_s(self, now: float | None = None) -> float:
        return float("inf") if self.at <= 0 else (time.monotonic() if now is None else now) - self.at

    def stale(self, stale_s: float, now: float | None = None) -> bool:
        return self.age_s(now) > stale_s


def parse_load(text: str, at: float) -> LoadReading:
    """The engine's gauges and counters from a Prometheus exposition (summed
    over label sets: one engine per replica, but a model may carry a version
    label)."""
    values = dict.fromkeys(_SAMPLES.values(), 0.0)
    found = False
    for family in text_string_to_metric_families(text):
        if family.name not in _FAMILIES:
            continue
        for sample in family.samples:
            field = _SAMPLES.get(sample.name)
            if field is None:
                continue  # a histogram's buckets, a counter's _created
            found = found or sample.name in _GAUGES
            values[field] += sample.value
    if not found:
        raise ValueError("none of the engine's load metrics in the exposition")
    return LoadReading(at=at, **values)
