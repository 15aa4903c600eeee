"""bench.attention_probe: its FLOP count, and an A/B run end to end on tiny
shapes (the baseline built from HEAD's sources, so its outputs equal the
working tree's: a clean checkout's are the same code)."""

from __future__ import annotations

import pytest

from bench import attention_probe
from python_llm.engine.worker.kernels import cpu_kernels

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None or not cpu_kernels().prefill_attention_supported(attention_probe.HEAD_DIM),
    reason="the native prefill attention does not build here",
)


def test_flops_count_each_tokens_keys() -> None:
    # 2 tokens after 3 cached positions see 4 and 5 keys: 9 key rows, QK^T and PV, 2 FLOPs a multiply-add
    heads, dim = attention_probe.HEADS, attention_probe.HEAD_DIM
    assert attention_probe.flops(3, 2, 1) == 2 * 2 * 9 * heads * dim
    assert attention_probe.flops(3, 2, 4) == 4 * attention_probe.flops(3, 2, 1)


def test_probe_against_a_baseline_prints_times_and_compares_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        attention_probe.main(
            ["--start", "40", "--tokens", "8", "17", "--layers", "2", "--rounds", "2", "--baseline", "HEAD"]
        )
        == 0
    )
    lines = [line for line in capsys.readouterr().out.splitlines() if "tokens:" in line]
    assert [line.split()[0] for line in lines] == ["8", "17"]
    for line in lines:
        assert "baseline" in line and "current / baseline time" in line
        # HEAD's kernels are the working tree's unless a kernel edit is uncommitted
        assert line.endswith("outputs identical")


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        attention_probe.main(["--tokens", "0"])
