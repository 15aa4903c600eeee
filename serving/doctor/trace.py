"""A metrics trace: timed scrapes of a Triton metrics endpoint (the engine's
`llm_*` families and Triton's own `nv_*`), reduced to the series the doctor
reads, saved as JSON lines so that a run can be diagnosed again later (the
tests diagnose recorded traces)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from contract import metric_names as m

# the families the doctor reads (label sets summed: one engine per server);
# the parser names a counter's family without its `_total`
WANTED = (
    m.REQUESTS_WAITING,
    m.REQUESTS_RUNNING,
    m.KV_BLOCKS_USED,
    m.KV_BLOCKS_CAPACITY,
    m.BATCH_SIZE,
    *(
        counter.removesuffix("_total")
        for counter in (m.PROMPT_TOKENS, m.GENERATION_TOKENS, m.PREEMPTIONS, m.REQUESTS_REJECTED)
    ),
    m.INTER_TOKEN_LATENCY,
    "nv_gpu_utilization",
)


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the trace began
    values: dict[str, float]  # "name" or "name_bucket{le}" -> value

    def get(self, name: str, default: float = 0.0) -> float:
        return self.values.get(name, default)

    def buckets(self, histogram: str) -> list[tuple[float, float]]:
        """(upper bound, cumulative count), ascending."""
        prefix = f"{histogram}_bucket:"
        return sorted((float(k[len(prefix) :]), v) for k, v in self.values.items() if k.startswith(prefix))


def reduce(text: str) -> dict[str, float]:
    """The wanted series of one exposition, summed over label sets."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in WANTED:
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = sample.name
            if sample.name.endswith("_bucket"):
                key = f"{sample.name}:{float(sample.labels['le'])}"
            values[key] = values.get(key, 0.0) + sample.value
    return values


def record(
    url: str,
    window_s: float,
    interval_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    on_sample: Callable[[Sample], None] = lambda s: None,
) -> list[Sample]:
    """Scrape `url` every `interval_s` for `window_s`; a failed scrape is
    skipped (the gap shows as a longer interval), every one failing raises."""
    samples: list[Sample] = []
    started = clock()
    failures: list[str] = []
    with httpx.Client(timeout=max(1.0, interval_s)) as http:
        while True:
            at = clock() - started
            try:
                response = http.get(url)
                response.raise_for_status()
                samples.append(Sample(round(at, 3), reduce(response.text)))
                on_sample(samples[-1])
            except (httpx.HTTPError, ValueError) as exc:
                failures.append(repr(exc))
            if at >= window_s:
                break
            sleep(max(0.0, interval_s - (clock() - started - at)))
    if len(samples) < 2:
        raise ConnectionError(f"--metrics {url}: fewer than 2 scrapes answered ({failures[-1] if failures else ''})")
    return samples


def save(samples: list[Sample], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"t": s.t, "values": s.values}, separators=(",", ":")) + "\n" for s in samples))


def load(path: Path) -> list[Sample]:
    return [
        Sample(float(row["t"]), {k: float(v) for k, v in row["values"].items()})
        for row in map(json.loads, path.read_text().splitlines())
        if row
    ]
