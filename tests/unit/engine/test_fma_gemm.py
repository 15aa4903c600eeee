"""The FMA projection (fp32 on AVX2 / FMA lanes, kernels/fma_gemm.cpp)
against float64: its error must be an fp32 GEMM's on every shape its blocks
have to pad (rows past a block of 6 or 8, columns past a panel of 16 or 32:
AVX2 or AVX-512 registers; K past a pass of 192), with bias and residual;
`FmaLinear` hands steps of many rows to oneDNN where the register width has a bound (zmm);
and "auto" picks it wherever it is built, unless AMX is there."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels
from python_llm.engine.worker.models.packed_linear import FMA_MAX_ROWS, FmaLinear, PackedLinear, projection_makers
from tests.unit.engine.gemm_cases import GemmCase


@pytest.fixture(scope="module")
def fma() -> CpuKernels:
    kernels = cpu_kernels()
    if kernels is None or not kernels.fma_gemm_supported():
        pytest.skip("the native kernels do not target AVX2 + FMA on this CPU")
    return kernels


@pytest.mark.parametrize(
    "m,n,k",
    [
        (1, 16, 1),
        (5, 17, 70),
        (6, 45, 192),
        (7, 100, 193),
        (13, 960, 576),
        (64, 576, 1536),
        (97, 3072, 576),
        (200, 33, 400),
    ],
)
@pytest.mark.parametrize("bias,residual", [(False, False), (True, True)])
def test_error_is_an_fp32_gemms(fma, m: int, n: int, k: int, bias: bool, residual: bool) -> None:
    case = GemmCase.random(m, n, k, bias, residual)
    result = fma.fma_linear(case.x, fma.fma_pack_weight(case.weight), n, k, case.bias, case.residual)
    assert result.shape == (m, n)
    # an fp32 GEMM's error bound, whatever the order of its sums
    assert case.within_fp32(result)


def test_rows_with_a_stride_and_a_zero_row_count(fma) -> None:
    gen = torch.Generator().manual_seed(8)
    weight = torch.randn(40, 24, generator=gen)
    wide = torch.randn(9, 50, generator=gen)
    x = wide[:, 3:27]  # rows 50 floats apart
    torch.testing.assert_close(
        fma.fma_linear(x, fma.fma_pack_weight(weight), 40, 24, None), F.linear(x, weight), atol=1e-5, rtol=1e-5
    )
    assert fma.fma_linear(torch.empty(0, 24), fma.fma_pack_weight(weight), 40, 24, None).shape == (0, 40)


@pytest.mark.parametrize("threads", [1, 3, 5])
def test_the_panels_handed_out_to_any_threads_give_the_same_bits(fma, threads: int) -> None:
    # the threads take runs of panels as they come free: which thread sums a
    # tile may change from call to call, its arithmetic must not (greedy
    # outputs are compared token for token)
    case = GemmCase.random(50, 7 * 16 + 3, 400, True, True)
    packed = fma.fma_pack_weight(case.weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = fma.fma_linear(case.x, packed, case.weight.shape[0], 400, case.bias, case.residual)
        torch.set_num_threads(threads)
        runs = [fma.fma_linear(case.x, packed, case.weight.shape[0], 400, case.bias, case.residual) for _ in range(4)]
    finally:
        torch.set_num_threads(before)
    for result in runs:
        assert torch.equal(result, alone)


def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(fma) -> None:
    # up to one pass of rows (96) the weight is read in another order (each
    # panel's K passes in turn, one stream) than with more rows; a tile's
    # passes keep their K order either way, so a row's result is the same
    # whichever step size it runs in, and greedy outputs do not change with
    # the batch
    case = GemmCase.random(300, 3 * 16 + 5, 2 * 192 + 11, True, True)
    packed = fma.fma_pack_weight(case.weight)
    n, k = case.weight.shape
    everything = fma.fma_linear(case.x, packed, n, k, case.bias, case.residual)
    for rows in (1, 4, 6, 7, 40, 95, 96, 97, 200):
        part = fma.fma_linear(case.x[:rows], packed, n, k, case.bias, case.residual[:rows])
        assert torch.equal(part, everything[:rows]), rows


def test_many_rows_go_to_onednn_and_agree(fma) -> None:
    gen = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(96, 64, generator=gen), torch.randn(96, generator=gen)
    linear = FmaLinear(weight, bias, fma)
    calls: list[int] = []

    class Counting(PackedLinear):
        __slots__ = ()

        def __call__(self, x: torch.Tensor) -> torch.Tensor:
            calls.append(x.shape[0])
            return super().__call__(x)

        def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
            calls.append(x.shape[0])
            return super().plus(x, other)

    bound = 40  # AVX-512's bound, or a bound set here where the build (AVX2) has none
    linear.max_rows, linear.many_rows = bound, Counting(weight, bias)
    for rows in (1, bound - 1, bound, bound + 40):
        x, other = torch.randn(rows, 64, generator=gen), torch.randn(rows, 96, generator=gen)
        torch.testing.assert_close(linear(x), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear.plus(x, other), F.linear(x, weight, bias) + other, atol=1e-5, rtol=1e-5)
    assert calls == [bound, bound, bound + 40, bound + 40]


def test_refuses_what_it_cannot_read(fma) -> None:
    with pytest.raises(ValueError, match="fma_pack_weight"):
        fma.fma_pack_weight(torch.randn(4, 8, dtype=torch.float64))
    packed = fma.fma_pack_weight(torch.randn(16, 32))
    with pytest.raises(ValueError, match="fma_linear"):
        fma.fma_linear(torch.randn(32, 4).t(), packed, 16, 32, None)
    with pytest.raises(ValueError, match="fma_linear"):
        fma.fma_linear(torch.randn(4, 32), packed, 16, 32, None, torch.randn(4, 8))


def test_the_bound_follows_the_register_width(fma) -> None:
    floats = fma.fma_vector_floats()
    assert floats in (8, 16)  # ymm or zmm: what -march=native gave this build
    linear = FmaLinear(torch.randn(32, 16), None, fma)
    assert linear.max_rows == FMA_MAX_ROWS[floats]
    assert FMA_MAX_ROWS[8] is None  # ymm: as fast as oneDNN or faster at every size measured
    assert FMA_MAX_ROWS[16] == 104  # zmm: oneDNN ahead from ~104 rows (measured)
    assert (linear.many_rows is None) == (FMA_MAX_ROWS[floats] is None)  # no unused second copy


def test_without_a_bound_every_step_runs_on_it(fma) -> None:
    gen = torch.Generator().manual_seed(5)
    weight, bias = torch.randn(48, 64, generator=gen), torch.randn(48, generator=gen)
    linear = FmaLinear(weight, bias, fma)
    linear.max_rows, linear.many_rows = None, None
    for rows in (1, 300, 700):
        x, other = torch.randn(rows, 64, generator=gen), torch.randn(rows, 48, generator=gen)
        torch.testing.assert_close(linear(x), F.linear(x, weight, bias), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(linear.plus(x, other), F.linear(x, weight, bias) + other, atol=1e-5, rtol=1e-5)


def test_auto_takes_it_wherever_it_is_built(fma) -> None:
    if fma.amx_gemm_supported():
        pytest.skip("AMX is there: 'auto' takes the AMX tiles")
    make_projection, make_lm_head = projection_makers("auto", fma)
    weight = torch.randn(32, 16)
    assert isinstance(make_projection(weight, None), FmaLinear)
    # the LM head's copy: the FMA GEMM's where it runs every step (ymm), else oneDNN's
    lm_head = make_lm_head(weight, None)
    assert isinstance(lm_head, FmaLinear if FMA_MAX_ROWS[fma.fma_vector_floats()] is None else PackedLinear)
    assert isinstance(projection_makers("fma", fma)[0](weight, None), FmaLinear)
    assert isinstance(projection_makers("onednn", fma)[0](weight, None), PackedLinear)


def test_auto_without_the_fma_build_is_onednn() -> None:
    make_projection, make_lm_head = projection_makers("auto", None)
    weight = torch.randn(32, 16)
    assert isinstance(make_projection(weight, None), PackedLinear)
    assert isinstance(make_lm_head(weight, None), PackedLinear)


def test_fma_without_the_kernels_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="linear_backend 'fma'"):
        projection_makers("fma", None)
