"""The terms of the fairness bench's TTFT / alone = c x s / (s - d):
the run alone's cost fitted by position, the slices' cost against it, the
paced steps' fill and the streams' part."""

from __future__ import annotations

import pytest

from bench.fairness_report import terms_table
from bench.fairness_terms import alone_fit, step_terms

A, B = 1e-3, 4e-7  # a token's fixed seconds, its attention's per earlier position
LAYERS = 30


def chunk_seconds(start: int, tokens: int) -> float:
    return tokens * (A + B * (start + tokens / 2))


def alone_steps() -> list[tuple[int, int, float]]:
    return [(start, 512, chunk_seconds(start, 512)) for start in range(0, 8192, 512)]


def test_the_fit_recovers_a_cost_linear_in_position():
    a, b = alone_fit(alone_steps())
    assert a == pytest.approx(A) and b == pytest.approx(B)
    assert alone_fit([(0, 512, 0.5)]) is None, "one chunk fixes no slope"


def test_the_terms_of_sliced_steps_against_the_run_alone():
    # 20 one-layer slices of 300 tokens, each costing 1.1x its token-layers alone,
    # beside streams whose part grows from 30 to 49 ms; planned at 80 ms, run at 76
    during, own = [], []
    for i in range(20):
        start = 300 * (i // LAYERS)
        slice_s = 1.1 * chunk_seconds(start, 300) / LAYERS
        during.append((start, 300, 0.030 + 0.001 * i + slice_s, 1))
        own.append(slice_s)
    aims = [step[2] / 0.95 for step in during]
    terms = step_terms(during, aims, own, alone_steps(), LAYERS)
    assert terms["slice_cost"] == pytest.approx(1.1)
    assert terms["fill"] == pytest.approx(0.95)
    assert terms["streams_part_start_ms"] == pytest.approx(30.5)  # the median of the first tenth (2 steps)
    assert terms["streams_part_end_ms"] == pytest.approx(48.5)


def test_steps_through_every_layer_or_unpaced_leave_the_terms_out():
    during = [(0, 512, 0.5, LAYERS), (512, 512, 0.6, LAYERS)]
    terms = step_terms(during, [None, None], [None, None], alone_steps(), LAYERS)
    assert terms == {"fill": None, "slice_cost": None, "streams_part_start_ms": None, "streams_part_end_ms": None}


def test_the_terms_table_checks_the_product_against_the_ratio_measured():
    row = {
        "label": "default",
        "itl_p50_before_ms": 33.0,
        "ttft_s": 48.0,
        "steps_during": 600,
        "ttft_over_alone": 2.2,
        "fill": 0.94,
        "slice_cost": 1.08,
        "streams_part_start_ms": 33.0,
        "streams_part_end_ms": 47.0,
    }
    line = terms_table([row]).splitlines()[-1]
    # s = 80 ms, d = 40 ms: 1.08 x 80 / 40 = 2.16
    assert line == "| default | 33 ms | 80.0 ms | 0.94 | 33 → 47 ms | 1.08 | 2.16 | 2.20x |"
    older = {
        k: v for k, v in row.items() if k not in ("fill", "slice_cost", "streams_part_start_ms", "streams_part_end_ms")
    }
    assert terms_table([older]).splitlines()[-1] == "| default | 33 ms | 80.0 ms | - | - | - | - | 2.20x |"
    assert "| default | 33 ms | - | 0.94 |" in terms_table([{**row, "steps_during": 0}])
