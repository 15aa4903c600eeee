"""A replica's load as its own metrics say it (the engine's waiting and
running requests, KV blocks used of capacity), scraped from its Prometheus
endpoint, and how fresh that reading is. A reading older than
`metrics_stale_s`, or none at all, counts as a saturated replica: the router
must not keep sending to a pod whose last metrics looked idle."""
from __future__ import annotations

import time
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from python_llm.engine.core.metrics import KV_BLOCKS_CAPACITY, KV_BLOCKS_USED, REQUESTS_RUNNING, REQUESTS_WAITING

_WANTED = {REQUESTS_WAITING: "waiting", REQUESTS_RUNNING: "running", KV_BLOCKS_USED: "kv_used",
           KV_BLOCKS_CAPACITY: "kv_capacity"}


@dataclass(frozen=True)
class LoadReading:
    waiting: float = 0.0
    running: float = 0.0
    kv_used: float = 0.0
    kv_capacity: float = 0.0
    at: float = 0.0                 # time.monotonic() of the scrape; 0: never

    @property
    def kv_utilisation(self) -> float:
        return self.kv_used / self.kv_capacity if self.kv_capacity > 0 else 1.0

    def age_s(self, now: float | None = None) -> float:
        return float("inf") if self.at <= 0 else (time.monotonic() if now is None else now) - self.at

    def stale(self, stale_s: float, now: float | None = None) -> bool:
        return self.age_s(now) > stale_s


def parse_load(text: str, at: float) -> LoadReading:
    """The engine's gauges from a Prometheus exposition (summed over label sets:
    one engine per replica, but a model may carry a version label)."""
    values = dict.fromkeys(_WANTED.values(), 0.0)
    found = False
    for family in text_string_to_metric_families(text):
        field = _WANTED.get(family.name)
        if field is None:
            continue
        found = True
        values[field] = sum(sample.value for sample in family.samples)
    if not found:
        raise ValueError("none of the engine's load metrics in the exposition")
    return LoadReading(at=at, **values)
