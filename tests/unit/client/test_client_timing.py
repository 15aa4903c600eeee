"""TTFT / ITL / TPOT arithmetic, measured like genai-perf."""

from __future__ import annotations

import pytest

from client import GenerationResult, StreamEvent, Timings, compute_tpot


def test_ttft_itl_tpot_from_arrival_times():
    result = GenerationResult(request_id="r", model="ensemble", transport="sse", timings=Timings(sent_s=10.0))
    for at, text, tokens in ((10.05, "", 0), (10.25, "Hel", 2), (10.30, "lo", 1), (10.31, "", 0), (10.45, "!", 1)):
        result.add(StreamEvent(text=text, num_output_tokens=tokens, received_s=at))
    result.timings.finish(10.50)
    assert result.ttft_s == pytest.approx(0.25)  # first response with tokens, not the first response
    assert result.itl_s == pytest.approx([0.05, 0.15])
    assert result.timings.chunk_gaps_s == pytest.approx([0.20, 0.05, 0.01, 0.14])
    assert result.e2e_s == pytest.approx(0.5)
    assert result.num_output_tokens == 4
    assert result.tpot_s == pytest.approx((0.5 - 0.25) / 3)
    as_dict = result.to_dict()
    assert as_dict["ttft_ms"] == pytest.approx(250.0) and as_dict["itl_ms"] == pytest.approx([50.0, 150.0])


def test_tpot_is_undefined_below_two_tokens():
    assert compute_tpot(1.0, 0.2, 1) is None
    assert compute_tpot(None, 0.2, 5) is None
    assert compute_tpot(1.0, 0.2, 5) == pytest.approx(0.2)


def test_finish_is_recorded_once():
    timings = Timings(sent_s=0.0)
    timings.finish(1.0)
    timings.finish(2.0)
    assert timings.e2e_s == 1.0 and timings.ttft_s is None and timings.itl_s == []


def test_token_count_falls_back_to_output_ids():
    result = GenerationResult(request_id="r", model="m", transport="grpc", timings=Timings(sent_s=0.0))
    result.add(StreamEvent(text="ab", output_ids=(1, 2), received_s=1.0))
    assert result.num_output_tokens == 2
