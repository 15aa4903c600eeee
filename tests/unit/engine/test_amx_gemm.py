"""The AMX projection (fp32 by three-way bf16 splitting on AMX tiles,
kernels/amx_gemm.cpp) against float64: its error must be an fp32 GEMM's,
on every shape the tiles have to pad (rows, columns, K), with bias and
residual; and `AmxLinear` hands steps of few rows to its fp32 copy on the
FMA GEMM."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels
from python_llm.engine.worker.models.packed_linear import AMX_MIN_ROWS, AmxLinear, FmaLinear
from tests.unit.engine.gemm_cases import GemmCase


@pytest.fixture(scope="module")
def amx() -> CpuKernels:
    kernels = cpu_kernels()
    if kernels is None or not kernels.amx_gemm_supported():
        pytest.skip("no AMX-BF16 on this CPU (the projections run on the FMA GEMM or oneDNN)")
    return kernels


# rows: one tile, a partial pair, several pairs; columns and K off the tile sizes
@pytest.mark.parametrize(
    "m,n,k",
    [(1, 16, 32), (7, 50, 40), (16, 96, 64), (33, 960, 576), (64, 200, 1536), (130, 3072, 576), (512, 576, 100)],
)
# a block of full tiles starts from the residual or the bias; with both, or cut, it adds them after
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (False, True), (True, True)])
def test_error_is_an_fp32_gemms(amx, m: int, n: int, k: int, bias: bool, residual: bool) -> None:
    case = GemmCase.random(m, n, k, bias, residual)
    result = amx.amx_linear(case.x, amx.amx_pack_weight(case.weight), n, k, case.bias, case.residual)
    assert result.shape == (m, n)
    # an fp32 GEMM's error bound, not bf16's (~4e-3 a product)
    assert case.within_fp32(result)


def test_a_residual_with_a_wider_row_stride(amx) -> None:
    # full blocks load the residual as tiles with its own row stride
    case = GemmCase.random(64, 96, 64, False, True)
    wide = torch.zeros(64, 96 + 40)
    wide[:, :96] = case.residual
    result = amx.amx_linear(case.x, amx.amx_pack_weight(case.weight), 96, 64, None, wide[:, :96])
    assert case.within_fp32(result)


@pytest.mark.parametrize("threads", [1, 3, 5])
def test_panels_taken_by_any_threads_give_the_same_bits(amx, threads: int) -> None:
    # a thread done early takes another's last panels, so which thread sums a
    # block changes from call to call; its arithmetic must not (greedy
    # outputs are compared token for token). 40 column pairs: several panels
    # a thread, and a last one cut short.
    case = GemmCase.random(70, 40 * 32 - 5, 600, False, True)
    n = case.weight.shape[0]
    packed = amx.amx_pack_weight(case.weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = amx.amx_linear(case.x, packed, n, 600, None, case.residual)
        torch.set_num_threads(threads)
        runs = [amx.amx_linear(case.x, packed, n, 600, None, case.residual) for _ in range(4)]
    finally:
        torch.set_num_threads(before)
    for result in runs:
        assert torch.equal(result, alone)


def test_values_bf16_cannot_hold_survive(amx) -> None:
    """1 + 2^-20 has no bf16 form; split in three it multiplies exactly."""
    weight = torch.full((16, 32), 1.0 + 2.0**-20)
    x = torch.zeros(1, 32)
    x[0, 0] = 1.0 + 2.0**-12
    result = amx.amx_linear(x, amx.amx_pack_weight(weight), 16, 32, None)
    expected = (1.0 + 2.0**-20) * (1.0 + 2.0**-12)
    assert torch.allclose(result.double(), torch.full((1, 16), expected, dtype=torch.float64), rtol=2**-23, atol=0)


def test_few_rows_go_to_the_fp32_copy_and_agree(amx) -> None:
    gen = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    linear = AmxLinear(weight, bias, amx)
    # the FMA GEMM's copy, for every step it gets: no third (oneDNN) copy
    assert type(linear.few_rows) is FmaLinear and linear.few_rows.many_rows is None
    for rows in (1, AMX_MIN_ROWS - 1, AMX_MIN_ROWS, 100):
        x, other = torch.randn(rows, 64, generator=gen), torch.randn(rows, 96, generator=gen)
        torch.testing.assert_close(linear(x), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear.plus(x, other), F.linear(x, weight, bias) + other, atol=1e-5, rtol=1e-5)


def test_refuses_what_it_cannot_read(amx) -> None:
    with pytest.raises(ValueError, match="amx_pack_weight"):
        amx.amx_pack_weight(torch.randn(4, 8, dtype=torch.float64))
    packed = amx.amx_pack_weight(torch.randn(16, 32))
    with pytest.raises(ValueError, match="amx_linear"):
        amx.amx_linear(torch.randn(32, 4).t(), packed, 16, 32, None)
    with pytest.raises(ValueError, match="amx_linear"):
        amx.amx_linear(torch.randn(4, 32), packed, 16, 32, None, torch.randn(4, 8))
