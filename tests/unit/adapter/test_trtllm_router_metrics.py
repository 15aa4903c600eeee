"""python_llm's TensorRT-LLM-named metrics (backends/python_llm/triton_metrics.py):
the names and label values of TensorRT-LLM's Triton backend (vendored in
tests/data/trtllm/custom_metrics.json with their source), each value derived
from the engine's own llm_* report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from contract import metric_names as m
from python_llm.triton_metrics import (
    KV_BLOCK_FAMILY,
    KV_BLOCK_TYPES,
    REQUEST_FAMILY,
    REQUEST_TYPES,
    ROUTER_FAMILIES,
    TritonMetrics,
)

REFERENCE = json.loads((Path(__file__).parents[2] / "data" / "trtllm" / "custom_metrics.json").read_text())


class FakePbUtils:
    """pb_utils.MetricFamily as the sink uses it: families by name, metrics by labels."""

    class MetricFamily:
        COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
        registry: dict[str, FakePbUtils.MetricFamily] = {}

        def __init__(self, name: str, description: str, kind: str) -> None:
            self.name, self.description, self.kind = name, description, kind
            self.metrics: list[FakePbUtils.Metric] = []
            FakePbUtils.MetricFamily.registry[name] = self

        def Metric(self, labels: dict[str, str], buckets: list[float] | None = None) -> FakePbUtils.Metric:
            metric = FakePbUtils.Metric(labels)
            self.metrics.append(metric)
            return metric

    class Metric:
        def __init__(self, labels: dict[str, str]) -> None:
            self.labels, self.value = labels, 0.0

        def set(self, value: float) -> None:
            self.value = value

        def increment(self, value: float) -> None:
            self.value += value

        def observe(self, value: float) -> None:
            pass


@pytest.fixture
def sink() -> TritonMetrics:
    FakePbUtils.MetricFamily.registry = {}
    return TritonMetrics(FakePbUtils, "python_llm", "1", max_num_seqs=8, tokens_per_block=16)


def _value(family: str, label_value: str) -> float:
    fam = FakePbUtils.MetricFamily.registry[family]
    label = ROUTER_FAMILIES[family][0]
    (metric,) = [x for x in fam.metrics if x.labels[label] == label_value]
    return metric.value


def test_names_labels_and_kinds_are_tensorrt_llms():
    """Family names, the label name and every label value exported exist in
    TensorRT-LLM's backend (v0.18.0, the first with waiting and fraction), as
    gauges with labels model and version."""
    FakePbUtils.MetricFamily.registry = {}
    TritonMetrics(FakePbUtils, "python_llm", "1", max_num_seqs=8, tokens_per_block=16)
    newest = REFERENCE["v0.18.0"]
    for family, label in REFERENCE["families"].items():
        assert ROUTER_FAMILIES[family][0] == label
        fam = FakePbUtils.MetricFamily.registry[family]
        assert fam.kind == "gauge"
        exported = {metric.labels[label] for metric in fam.metrics}
        assert exported <= set(newest[family]), exported - set(newest[family])
        assert all(set(metric.labels) == {"model", "version", label} for metric in fam.metrics)
        assert all(metric.labels["model"] == "python_llm" for metric in fam.metrics)
    # what the routers read is among them
    assert {"waiting", "scheduled"} <= set(REQUEST_TYPES)
    assert {"fraction", "tokens_per", "max"} <= set(KV_BLOCK_TYPES)
    for query in REFERENCE["routers"].values():
        if query.startswith("nv_trt_llm"):
            family, _, rest = query.partition("{")
            label, _, value = rest.rstrip("}").partition("=")
            assert ROUTER_FAMILIES[family][0] == label and value in (REQUEST_TYPES | KV_BLOCK_TYPES)


def test_values_follow_the_engines_own_gauges(sink: TritonMetrics):
    assert _value(REQUEST_FAMILY, "max") == 8 and _value(KV_BLOCK_FAMILY, "tokens_per") == 16
    sink.gauge_set(m.KV_BLOCKS_CAPACITY, 100)
    assert (_value(KV_BLOCK_FAMILY, "max"), _value(KV_BLOCK_FAMILY, "free"), _value(KV_BLOCK_FAMILY, "fraction")) == (
        100,
        100,
        0.0,
    )
    sink.gauge_set(m.KV_BLOCKS_USED, 25)
    sink.gauge_set(m.REQUESTS_RUNNING, 3)
    sink.gauge_set(m.REQUESTS_WAITING, 5)
    assert _value(KV_BLOCK_FAMILY, "used") == 25 and _value(KV_BLOCK_FAMILY, "free") == 75
    assert _value(KV_BLOCK_FAMILY, "fraction") == pytest.approx(0.25)
    # TensorRT-LLM: waiting = active - scheduled; here active = running + waiting
    assert (
        _value(REQUEST_FAMILY, "scheduled"),
        _value(REQUEST_FAMILY, "waiting"),
        _value(REQUEST_FAMILY, "active"),
    ) == (3, 5, 8)
    # idle again
    for name in (m.KV_BLOCKS_USED, m.REQUESTS_RUNNING, m.REQUESTS_WAITING):
        sink.gauge_set(name, 0)
    assert [_value(REQUEST_FAMILY, t) for t in ("active", "scheduled", "waiting")] == [0, 0, 0]
    assert (_value(KV_BLOCK_FAMILY, "fraction"), _value(KV_BLOCK_FAMILY, "free")) == (0.0, 100)
    # the llm_* families still carry the same values
    llm_used = FakePbUtils.MetricFamily.registry[m.KV_BLOCKS_USED].metrics[0]
    assert llm_used.value == 0


def test_reused_counts_blocks_served_from_the_prefix_cache(sink: TritonMetrics):
    sink.counter_add(m.PREFIX_CACHE_HIT_TOKENS, 32)
    sink.counter_add(m.PREFIX_CACHE_HIT_TOKENS, 16)
    sink.counter_add(m.PROMPT_TOKENS, 99)  # other counters leave it alone
    assert _value(KV_BLOCK_FAMILY, "reused") == 3


def test_no_capacity_is_no_fraction(sink: TritonMetrics):
    sink.gauge_set(m.KV_BLOCKS_USED, 4)
    assert _value(KV_BLOCK_FAMILY, "fraction") == 0.0 and _value(KV_BLOCK_FAMILY, "free") == 0.0
