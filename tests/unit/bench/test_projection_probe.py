"""bench.projection_probe: an A/B run of the FMA GEMM end to end on one
layer (the baseline built from HEAD's sources: its outputs equal the
working tree's, whose changes to the FMA GEMM keep each tile's summation
order)."""

from __future__ import annotations

import pytest

from bench import projection_probe
from python_llm.engine.worker.kernels import cpu_kernels

pytestmark = pytest.mark.skipif(
    cpu_kernels() is None or not cpu_kernels().fma_gemm_supported(), reason="the FMA GEMM does not build here"
)


def test_probe_against_a_baseline_times_both_and_compares_outputs(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        projection_probe.main(
            ["--rows", "3", "70", "--layers", "1", "--repeats", "1", "--shapes", "o", "down", "--baseline", "HEAD"]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    header = next(line for line in out if line.startswith("| rows"))
    assert "FMA GEMM @HEAD" in header and header.endswith("FMA outputs |")
    rows = [line for line in out if line.startswith(("| 3 ", "| 70 "))]
    assert len(rows) == 2
    for line in rows:
        assert line.endswith("| identical |"), line
