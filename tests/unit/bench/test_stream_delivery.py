"""The served row's account of how tokens reached the streams."""
from __future__ import annotations

from bench.triton_ensemble import StreamTally, delivery


def test_delivery_pools_each_streams_gaps_and_counts_tokens_per_response():
    a = StreamTally(output_tokens=4, token_responses=[0.0, 0.1, 0.3])      # gaps 100, 200 ms
    b = StreamTally(output_tokens=2, token_responses=[5.0, 5.4])           # gap 400 ms
    got = delivery([a, b])
    assert got["responses"] == 5 and got["tokens_per_response"] == 1.2
    assert got["gap_ms_p50"] == 200.0 and got["gap_ms_p99"] == 400.0


def test_no_streamed_response_means_no_gaps():
    assert delivery([StreamTally()]) == {"responses": 0, "tokens_per_response": 0.0,
                                         "gap_ms_p50": 0.0, "gap_ms_p99": 0.0}
