"""The served row's account of how tokens reached the streams, and the
paired offline / served rounds."""

from __future__ import annotations

from bench.triton_ensemble import StreamTally, delivery


def test_delivery_pools_each_streams_gaps_and_counts_tokens_per_response():
    a = StreamTally(output_tokens=4, token_responses=[0.0, 0.1, 0.3])  # gaps 100, 200 ms
    b = StreamTally(output_tokens=2, token_responses=[5.0, 5.4])  # gap 400 ms
    got = delivery([a, b])
    assert got["responses"] == 5 and got["tokens_per_response"] == 1.2
    assert got["gap_ms_p50"] == 200.0 and got["gap_ms_p99"] == 400.0


def test_no_streamed_response_means_no_gaps():
    assert delivery([StreamTally()]) == {
        "responses": 0,
        "tokens_per_response": 0.0,
        "gap_ms_p50": 0.0,
        "gap_ms_p99": 0.0,
    }


def test_paired_rounds_use_fresh_seeds_and_the_median_ratio_round():
    from bench.result import MethodResult
    from bench.served_rounds import Round, median_round, round_workloads
    from bench.workload import Vocabulary, WorkloadSpec

    workloads = round_workloads(WorkloadSpec(num_requests=4, seed=7), Vocabulary(size=1000, special_ids=frozenset()), 3)
    assert len({tuple(r.prompt_ids for r in w) for w in workloads}) == 3, "each round its own prompts"

    def row(tok_s: float) -> MethodResult:
        return MethodResult("m", "m", "float32", useful_output_tokens=int(tok_s), seconds=1.0, num_requests=1)

    rounds = [Round(row(300), row(240)), Round(row(200), row(190)), Round(row(250), row(225))]
    assert [round(r.ratio, 2) for r in rounds] == [0.8, 0.95, 0.9]
    assert median_round(rounds) is rounds[2]
    assert median_round(rounds[:2]) is rounds[0], "an even count takes the lower middle"
