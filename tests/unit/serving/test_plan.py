"""`serving plan`: the article's exercise 1, and the edge cases."""

from __future__ import annotations

import argparse
import json

import pytest

from serving.capacity.command import add_parser, explain, plan_input
from serving.capacity.model import Measurement, PlanError, PlanInput, Redundancy, make_plan


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    return parser.parse_args(["plan", *argv])


def exercise(batched_tokens_per_s: float) -> PlanInput:
    return PlanInput(
        peak_qps=10,
        mean_output_tokens=500,
        redundancy=Redundancy.parse("2N"),
        measurements=(Measurement(1, 30.0), Measurement(64, batched_tokens_per_s)),
    )


def test_exercise_1_naive_167_batched_2_to_3_and_4_to_6_with_availability():
    low, mid, high = (make_plan(exercise(t)) for t in (2000.0, 2500.0, 3000.0))
    assert low.naive_replicas == mid.naive_replicas == 167, "5,000 tokens/s / 30 tokens/s"
    assert (high.replicas_needed, mid.replicas_needed, low.replicas_needed) == (2, 2, 3)
    assert (high.replicas, low.replicas) == (4, 6)
    assert low.demand_tokens_per_s == 5000


def test_the_cli_shows_its_reasoning():
    given = plan_input(
        _args(
            "--peak-qps",
            "10",
            "--mean-output-tokens",
            "500",
            "--throughput",
            "1:30",
            "--throughput",
            "64:2500",
            "--redundancy",
            "2N",
        )
    )
    text = explain(given, make_plan(given))
    assert "5,000 output tokens/s" in text and "= 167 replicas" in text and "N = 2" in text
    assert "2N redundancy" in text and "= 4" in text


def test_the_slo_picks_the_operating_point_and_an_impossible_slo_is_an_error():
    points = (Measurement(1, 20, 0.1), Measurement(8, 120, 0.4), Measurement(32, 300, 2.5))
    plan = make_plan(
        PlanInput(peak_qps=2, mean_output_tokens=100, measurements=points, tpot_slo_s=0.1, ttft_p90_slo_s=1.0)
    )
    assert plan.operating_point.concurrency == 8, "c=32 misses TTFT and TPOT"
    assert [m.concurrency for m, _ in plan.rejected] == [32]
    with pytest.raises(PlanError, match="no measured concurrency meets the SLO"):
        make_plan(PlanInput(peak_qps=2, mean_output_tokens=100, measurements=points, tpot_slo_s=0.01))


def test_littles_law_can_need_more_replicas_than_throughput():
    # a long TTFT keeps requests in flight: 5 req/s x (10 s + 100 x 0.05 s) = 75 in flight, 16 per replica
    plan = make_plan(
        PlanInput(
            peak_qps=5,
            mean_output_tokens=100,
            redundancy=Redundancy(0),
            min_replicas=1,
            measurements=(Measurement(16, 320, ttft_p90_s=10.0),),
        )
    )
    assert plan.replicas_for_throughput == 2 and plan.replicas_for_concurrency == 5 and plan.replicas == 5


def test_floors_redundancy_headroom_and_gpus():
    tiny = make_plan(
        PlanInput(
            peak_qps=0.1,
            mean_output_tokens=10,
            measurements=(Measurement(4, 100),),
            redundancy=Redundancy(0),
            gpus_per_replica=4,
        )
    )
    assert tiny.replicas_needed == 1 and tiny.replicas == 2 and tiny.gpus == 8, "availability floor of 2"
    exact = make_plan(
        PlanInput(
            peak_qps=10,
            mean_output_tokens=100,
            measurements=(Measurement(10, 1000),),
            redundancy=Redundancy(1),
            min_replicas=1,
        )
    )
    assert exact.replicas_needed == 1 and exact.replicas == 2, "exactly at capacity is 1, not 2, before N+1"
    headroom = make_plan(
        PlanInput(
            peak_qps=10,
            mean_output_tokens=100,
            measurements=(Measurement(10, 1000),),
            max_utilisation=0.5,
            redundancy=Redundancy(0),
            min_replicas=1,
        )
    )
    assert headroom.replicas == 2


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--throughput", "64"], "--throughput: C:TOK_S"),
        (["--throughput", "1.5:30"], "whole number"),
        (["--throughput", "0:30"], "concurrency >= 1"),
        (["--redundancy", "N-1", "--throughput", "1:30"], "--redundancy"),
        (["--max-utilisation", "1.5", "--throughput", "1:30"], "--max-utilisation"),
        ([], "at least one measured concurrency"),
    ],
)
def test_bad_options_name_themselves(argv, message):
    with pytest.raises(PlanError, match=message):
        plan_input(_args("--peak-qps", "1", "--mean-output-tokens", "10", *argv))


def test_measurements_from_a_bench_record(tmp_path):
    record = tmp_path / "capacity.json"
    record.write_text(
        json.dumps(
            {
                "measurements": [
                    {"concurrency": 1, "output_tokens_per_s": 15.0, "ttft_p90_s": 0.2, "tpot_s": 0.066},
                    {"concurrency": 16, "output_tokens_per_s": 90.0, "ttft_p90_s": 1.5, "tpot_s": 0.18},
                ]
            }
        )
    )
    given = plan_input(_args("--peak-qps", "1", "--mean-output-tokens", "100", "--bench-json", str(record)))
    assert make_plan(given).operating_point.concurrency == 16
    record.write_text("{}")
    with pytest.raises(PlanError, match="--bench-json"):
        plan_input(_args("--peak-qps", "1", "--mean-output-tokens", "100", "--bench-json", str(record)))
