"""The engine's MetricsSink backed by Triton's custom metrics (pb_utils), so
the families appear on the metrics port with labels model and version.

Besides the contract's `llm_*` families, the sink exports two of TensorRT-LLM's
Triton-backend families under their exact names and labels, so that routers
written for TensorRT-LLM on Triton (the Gateway API Inference Extension's EPP,
llm-d) read this engine unchanged: `nv_trt_llm_request_metrics{request_type}`
and `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type}`. They have no
source of their own: every value is derived, in the same call, from the gauge
or counter the engine reports for the `llm_*` family (`RouterMetrics`), so the
two views of one engine never disagree.

Names, labels and meaning follow TensorRT-LLM's Triton backend,
`inflight_batcher_llm/src/custom_metrics_reporter/custom_metrics_reporter.cc`
(label values) and `model_instance_state.cc` `WaitForStats` (what each value
is) in triton-inference-server/tensorrtllm_backend; `waiting` and `fraction`
exist there from v0.18.0 on (tests/data/trtllm/custom_metrics.json)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from contract import metric_names as m

from .engine.core.metrics import METRIC_FAMILIES, MetricsSink

REQUEST_FAMILY = "nv_trt_llm_request_metrics"
KV_BLOCK_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
# family -> (its label, TensorRT-LLM's description of the family)
ROUTER_FAMILIES: dict[str, tuple[str, str]] = {
    REQUEST_FAMILY: ("request_type", "TRT LLM request metrics"),
    KV_BLOCK_FAMILY: ("kv_cache_block_type", "TRT LLM KV cache block metrics"),
}
# The label values exported, with their meaning here (TensorRT-LLM's in brackets).
# Not exported: request_type "context" (requests in their context phase in the
# last iteration) -- the engine's metrics path does not report it.
REQUEST_TYPES: dict[str, str] = {
    "active": "requests the engine holds: running + waiting [numActiveRequests]",
    "max": "most sequences in one engine step, max_num_seqs [maxNumActiveRequests]",
    "scheduled": "requests in the running batch, llm_num_requests_running [numScheduledRequests]",
    "waiting": "requests waiting to be scheduled, llm_num_requests_waiting [active - scheduled]",
}
KV_BLOCK_TYPES: dict[str, str] = {
    "max": "KV blocks in total, llm_kv_cache_blocks_capacity [maxNumBlocks]",
    "free": "max - used [freeNumBlocks]",
    "used": "KV blocks in use, llm_kv_cache_blocks_used [usedNumBlocks]",
    "tokens_per": "tokens per KV block, block_size [tokensPerBlock]",
    "reused": "blocks served from the prefix cache so far, llm_prefix_cache_hit_tokens_total / block_size "
    "[reusedBlocks]",
    "fraction": "used / max, 0 when max is 0 [Fraction used KV cache blocks]",
}


class RouterMetrics:
    """TensorRT-LLM's router-facing gauges as a function of what the engine
    reports: `on_gauge` / `on_counter` are called with every `llm_*` update and
    set the derived values through `set_value(family, label_value, value)`."""

    def __init__(self, set_value: Callable[[str, str, float], None], max_num_seqs: int, tokens_per_block: int) -> None:
        self._set = set_value
        self._tokens_per_block = tokens_per_block
        self._running = 0.0
        self._waiting = 0.0
        self._used = 0.0
        self._capacity = 0.0
        self._hit_tokens = 0.0
        set_value(REQUEST_FAMILY, "max", float(max_num_seqs))
        set_value(KV_BLOCK_FAMILY, "tokens_per", float(tokens_per_block))
        for name in ("active", "scheduled", "waiting"):
            set_value(REQUEST_FAMILY, name, 0.0)
        for name in ("max", "free", "used", "reused", "fraction"):
            set_value(KV_BLOCK_FAMILY, name, 0.0)

    def on_gauge(self, name: str, value: float) -> None:
        if name == m.REQUESTS_RUNNING or name == m.REQUESTS_WAITING:
            if name == m.REQUESTS_RUNNING:
                self._running = value
                self._set(REQUEST_FAMILY, "scheduled", value)
            else:
                self._waiting = value
                self._set(REQUEST_FAMILY, "waiting", value)
            self._set(REQUEST_FAMILY, "active", self._running + self._waiting)
        elif name == m.KV_BLOCKS_USED or name == m.KV_BLOCKS_CAPACITY:
            if name == m.KV_BLOCKS_USED:
                self._used = value
                self._set(KV_BLOCK_FAMILY, "used", value)
            else:
                self._capacity = value
                self._set(KV_BLOCK_FAMILY, "max", value)
            self._set(KV_BLOCK_FAMILY, "free", max(self._capacity - self._used, 0.0))
            self._set(KV_BLOCK_FAMILY, "fraction", self._used / self._capacity if self._capacity > 0 else 0.0)

    def on_counter(self, name: str, value: float) -> None:
        if name == m.PREFIX_CACHE_HIT_TOKENS:
            # the prefix cache hands out whole blocks: the tokens are a multiple of the block size
            self._hit_tokens += value
            self._set(KV_BLOCK_FAMILY, "reused", self._hit_tokens // self._tokens_per_block)


class TritonMetrics(MetricsSink):
    def __init__(
        self, pb_utils: Any, model_name: str, model_version: str, *, max_num_seqs: int, tokens_per_block: int
    ) -> None:
        labels = {"model": model_name, "version": model_version}
        kinds = {
            "counter": pb_utils.MetricFamily.COUNTER,
            "gauge": pb_utils.MetricFamily.GAUGE,
            "histogram": pb_utils.MetricFamily.HISTOGRAM,
        }
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
        # TensorRT-LLM's families: gauges, one metric per label value
        self._router_metrics: dict[tuple[str, str], Any] = {}
        for router_family, (label, description) in ROUTER_FAMILIES.items():
            fam = pb_utils.MetricFamily(name=router_family, description=description, kind=pb_utils.MetricFamily.GAUGE)
            self._family_objects.append(fam)
            values = REQUEST_TYPES if router_family == REQUEST_FAMILY else KV_BLOCK_TYPES
            for value in values:
                self._router_metrics[(router_family, value)] = fam.Metric(labels={**labels, label: value})
        self._router = RouterMetrics(self._set_router, max_num_seqs, tokens_per_block)

    def _set_router(self, family: str, label_value: str, value: float) -> None:
        self._router_metrics[(family, label_value)].set(value)

    def counter_add(self, name: str, value: float) -> None:
        self._metrics[name].increment(value)
        self._router.on_counter(name, value)

    def gauge_set(self, name: str, value: float) -> None:
        self._metrics[name].set(value)
        self._router.on_gauge(name, value)

    def histogram_observe(self, name: str, value: float) -> None:
        self._metrics[name].observe(value)
