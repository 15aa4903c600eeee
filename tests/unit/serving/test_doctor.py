"""`serving doctor`: the right cause on three recorded traces (one per cause,
recorded from a real tritonserver with `python -m bench.doctor_load`), and
the arithmetic on synthetic ones."""

from __future__ import annotations

from pathlib import Path

import pytest

from serving.doctor.command import render
from serving.doctor.diagnose import REPORT_SCORE, diagnose, idle
from serving.doctor.intervals import intervals, quantile
from serving.doctor.trace import Sample, load, reduce, save

TRACES = Path(__file__).resolve().parents[2] / "data" / "doctor"


@pytest.mark.parametrize("cause", ["not_batched", "long_prefill", "kv_pressure"])
def test_each_recorded_trace_names_its_own_cause_and_only_it(cause):
    findings = diagnose(intervals(load(TRACES / f"{cause}.jsonl")))
    assert findings[0].cause == cause and findings[0].score >= REPORT_SCORE, findings
    assert all(f.score < REPORT_SCORE for f in findings[1:]), findings
    assert findings[0].evidence and findings[0].advice


def _sample(t: float, **values: float) -> Sample:
    return Sample(t, {k.replace("__", ":"): v for k, v in values.items()})


def _itl(sample_values: dict[str, float], counts: dict[float, float]) -> None:
    for le, count in counts.items():
        sample_values[f"llm_inter_token_latency_seconds_bucket:{le}"] = count


def test_histogram_quantiles_interpolate_within_the_bucket_like_prometheus():
    a, b = Sample(0, {}), Sample(1, {})
    _itl(a.values, {0.1: 0, 0.5: 0, float("inf"): 0})
    _itl(b.values, {0.1: 50, 0.5: 100, float("inf"): 100})
    assert quantile(0.5, a, b, "llm_inter_token_latency_seconds") == pytest.approx(0.1)
    assert quantile(0.75, a, b, "llm_inter_token_latency_seconds") == pytest.approx(0.3)
    assert quantile(0.5, a, a, "llm_inter_token_latency_seconds") is None, "no observation: no quantile"


def test_a_counter_reset_counts_from_zero_and_an_idle_server_is_said_to_be_idle():
    samples = [_sample(0, llm_generation_tokens_total=500.0), _sample(1, llm_generation_tokens_total=20.0)]
    assert intervals(samples)[0].generated_tokens == 20, "the server restarted between the scrapes"
    quiet = [_sample(t) for t in range(4)]
    assert idle(intervals(quiet))


def test_a_growing_queue_with_room_in_the_kv_cache_is_named():
    samples = [
        _sample(
            t,
            llm_num_requests_waiting=float(2 * t),
            llm_num_requests_running=2.0,
            llm_kv_cache_blocks_used=10.0,
            llm_kv_cache_blocks_capacity=100.0,
            llm_batch_size_sum=4.0 * t,
            llm_batch_size_count=2.0 * t,
            llm_generation_tokens_total=4.0 * t,
        )
        for t in range(12)
    ]
    top = diagnose(intervals(samples))[0]
    assert top.cause == "queue_growth" and top.score >= REPORT_SCORE
    assert "grew from" in top.evidence[0]


def test_the_report_lists_causes_with_evidence_and_what_to_do():
    text = render(diagnose(intervals(load(TRACES / "not_batched.jsonl"))), 30)
    assert "1. requests are not batched" in text and "evidence:" in text and "engine.max_num_seqs" in text
    assert "not indicated: " in text


def test_a_trace_round_trips_and_keeps_only_what_the_doctor_reads(tmp_path):
    exposition = """# TYPE llm_num_requests_waiting gauge
llm_num_requests_waiting{model="python_llm",version="1"} 3
# TYPE llm_preemptions_total counter
llm_preemptions_total{model="python_llm",version="1"} 2
# TYPE nv_inference_count counter
nv_inference_count{model="ensemble",version="1"} 9
# TYPE llm_batch_size histogram
llm_batch_size_bucket{model="python_llm",version="1",le="1"} 4
llm_batch_size_bucket{model="python_llm",version="1",le="+Inf"} 5
llm_batch_size_sum{model="python_llm",version="1"} 7
llm_batch_size_count{model="python_llm",version="1"} 5
"""
    values = reduce(exposition)
    assert values == {
        "llm_num_requests_waiting": 3,
        "llm_preemptions_total": 2,
        "llm_batch_size_bucket:1.0": 4,
        "llm_batch_size_bucket:inf": 5,
        "llm_batch_size_sum": 7,
        "llm_batch_size_count": 5,
    }
    save([Sample(0.0, values), Sample(1.0, values)], tmp_path / "t.jsonl")
    assert load(tmp_path / "t.jsonl")[1].values == values
