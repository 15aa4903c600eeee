"""The spread of steps over their plan (core/step_spread.py)."""

from __future__ import annotations

import pytest

from python_llm.engine.core.step_spread import StepSpread


def test_empty_is_no_spread() -> None:
    assert StepSpread(8, 0.99).value() == 1.0


def test_the_quantile_is_the_sample_at_its_rank() -> None:
    spread = StepSpread(128, 0.99)
    for i in range(100):
        spread.add(1.0 + i / 100, 1.0)  # ratios 1.00 .. 1.99
    assert spread.value() == pytest.approx(1.98)  # the 99th of 100
    median = StepSpread(128, 0.5)
    for ratio in (1.3, 1.0, 1.1, 1.2):
        median.add(ratio * 2.0, 2.0)
    assert median.value() == pytest.approx(1.1)


def test_one_stall_is_not_a_spread() -> None:
    spread = StepSpread(128, 0.99)
    for _ in range(26):
        spread.add(1.02, 1.0)
    spread.add(1.5, 1.0)  # the one stalled step before a long prompt
    assert spread.value() == pytest.approx(1.02)
    spread.add(1.4, 1.0)  # a second one: that is the machine
    assert spread.value() == pytest.approx(1.4)


def test_old_samples_leave_the_window() -> None:
    spread = StepSpread(4, 1.0)
    spread.add(3.0, 1.0)
    assert spread.value() == 3.0
    for _ in range(4):
        spread.add(1.1, 1.0)
    assert spread.value() == pytest.approx(1.1) and len(spread) == 4


def test_no_sample_without_a_plan_or_a_time() -> None:
    spread = StepSpread(4, 0.99)
    spread.add(1.0, 0.0)
    spread.add(0.0, 1.0)
    assert len(spread) == 0
    with pytest.raises(ValueError, match="quantile"):
        StepSpread(4, 0.0)
