"""The fairness bench's figures: the targets against the streams' ITL
before the long prompt, and the control (the same steps, no long prompt)."""

from __future__ import annotations

import pytest

pytest.importorskip("python_llm.engine.engine")

from bench.fairness_measurement import Measurement  # noqa: E402
from bench.fairness_report import table  # noqa: E402


def _measurement() -> Measurement:
    m = Measurement(
        "default",
        {"max_num_batched_tokens": 512},
        load_before=0.1,
        long_tokens=8191,
        ttft_alone_s=10.0,
        ttft_s=25.0,
        num_layers=30,
    )
    m.itl_before_s = [0.020] * 9 + [0.030]  # p50 20 ms
    m.itl_during_s = [0.050] * 90 + [0.070] * 10  # p99 70 ms
    m.itl_control_before_s = [0.020] * 10
    m.itl_control_s = [0.030] * 90 + [0.040] * 10
    m.during_steps = [(0, 512, 0.05, 30)] * 3 + [(512, 200, 0.05, 2)]
    m.margins = [1.0, 1.1, 1.2, 1.3]
    m.pacer_decode_s = 0.021
    return m


def test_the_summary_judges_both_targets_and_reports_the_control_growth():
    s = _measurement().summary(best_alone_s=8.0)
    assert s["itl_p99_over_p50_before"] == pytest.approx(3.5)
    assert s["meets_itl"] is False, "3.5x is over the 3x limit"
    assert s["ttft_over_alone"] == 2.5 and s["meets_ttft"] is False
    assert s["ttft_over_best_alone"] == pytest.approx(25.0 / 8.0)
    assert s["itl_p99_control_over_p50_before"] == pytest.approx(2.0)
    assert s["sliced_steps_during"] == 1
    assert s["margin_p50"] == pytest.approx(1.15) and s["margin_max"] == 1.3
    assert s["pacer_decode_ms"] == pytest.approx(21.0)
    assert s["pacer_decode_over_p50_before"] == pytest.approx(1.05)


def test_the_table_shows_the_control_and_the_margin_and_reads_results_written_before_them():
    row = _measurement().summary(best_alone_s=10.0)
    assert "| 2.0x |" in table([row])
    assert "| 4 | 1.15 / 1.30 | 1.05x |" in table([row])
    older = {k: v for k, v in row.items() if not k.startswith(("itl_p99_control", "margin_", "pacer_"))}
    assert "x ✗ | - |" in table([older])
    assert "| 4 | - | - |" in table([older])
