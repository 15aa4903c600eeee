"""The engine's MetricsSink backed by Triton's custom metrics (pb_utils), so
the families appear on the metrics port with labels model and version."""
from __future__ import annotations

from typing import Any

from .engine.core.metrics import METRIC_FAMILIES, MetricsSink


class TritonMetrics(MetricsSink):
    def __init__(self, pb_utils: Any, model_name: str, model_version: str) -> None:
        labels = {"model": model_name, "version": model_version}
        kinds = {"counter": pb_utils.MetricFamily.COUNTER, "gauge": pb_utils.MetricFamily.GAUGE,
                 "histogram": pb_utils.MetricFamily.HISTOGRAM}
        self._metrics: dict[str, Any] = {}
        # Triton requires a family to outlive its metrics: keep both
        self._family_objects: list[Any] = []
        for family in METRIC_FAMILIES:
            fam = pb_utils.MetricFamily(name=family.name, description=family.description, kind=kinds[family.kind])
            self._family_objects.append(fam)
            if family.kind == "histogram":
                self._metrics[family.name] = fam.Metric(labels=labels, buckets=list(family.buckets))
            else:
                self._metrics[family.name] = fam.Metric(labels=labels)
        self._families = {family.name: family.kind for family in METRIC_FAMILIES}

    def counter_add(self, name: str, value: float) -> None:
        self._metrics[name].increment(value)

    def gauge_set(self, name: str, value: float) -> None:
        self._metrics[name].set(value)

    def histogram_observe(self, name: str, value: float) -> None:
        self._metrics[name].observe(value)
