"""Greedy rows on the int16 LM head with the exact argmax over its candidates
(models/int16_greedy_head.py, kernels/int16_lm_head.cpp), its own cases:
every approximate logit against its bound (recomputed here from the
quantization's definition), rows of zeros, a dimension large enough to cut
the hidden rows' levels, and bad arguments. The cases both verified heads
share (the argmax against a float64 GEMM, near-ties, exact ties, vocabulary
tails past the 16-row tiles, rows that are not finite, `auto`'s choice and
the model's tokens on it) are test_verified_greedy.py's. The kernel has a
scalar path, so these run on any CPU."""

from __future__ import annotations

import pytest
import torch

from python_llm.engine.worker.kernels import CpuKernels
from python_llm.engine.worker.models.int16_greedy_head import Int16GreedyHead

WEIGHT_LEVELS = 1023


def exact_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> list[int]:
    return (hidden.double() @ weight.double().t()).argmax(dim=-1).tolist()


def hidden_levels(dim: int) -> int:
    return min(2047, (2**31 - 1) // (-(-dim // 2) * 2 * WEIGHT_LEVELS))


def bound_factors(hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """m1 = s ||hq||, m2 = s ||e|| per row, from h = s (hq + e), |hq| <= levels."""
    levels = hidden_levels(hidden.shape[1])
    scale = (hidden.abs().amax(dim=1) / levels).float()
    quantized = torch.round(hidden / scale[:, None]).clamp(-levels, levels)
    residual = hidden.double() / scale.double()[:, None] - quantized.double()
    return scale.double() * quantized.double().norm(dim=1), scale.double() * residual.norm(dim=1)


@pytest.mark.parametrize("dim", [8, 13, 576, 2048])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_every_int16_logit_is_within_the_bound(native: CpuKernels, dim: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(dim)
    weight = torch.randn(3001, dim, generator=gen) * scale
    hidden = torch.randn(17, dim, generator=gen) * torch.logspace(-2, 2, 17).unsqueeze(1)
    hidden[3, 5] *= 40  # an outlier, as hidden states have
    head = Int16GreedyHead(weight, native)
    head(hidden)
    vocab = weight.shape[0]
    approx = head._scratch[: 17 * head.packed.scales.shape[0]].view(17, -1)[:, :vocab].double()
    exact = hidden.double() @ weight.double().t()
    m1, m2 = bound_factors(hidden)
    allowed = m1[:, None] * head.packed.p_factor[:vocab].double() + m2[:, None] * head.packed.q_factor[:vocab].double()
    worst = ((approx - exact).abs() / allowed).max().item()
    assert worst <= 1.0, f"an int16 logit's error is {worst:.3f}x its bound"
    assert worst > 1e-3  # and the bound is not vacuous
    # the padding rows past the vocabulary never raise a row's floor
    assert bool((head.packed.p_factor[vocab:] > 1e29).all())


def decide(native: CpuKernels, hidden: torch.Tensor, weight: torch.Tensor) -> tuple[list[int], list[int]]:
    return Int16GreedyHead(weight, native)(hidden)


def test_rows_of_zeros(native) -> None:
    """A hidden row of zeros has every logit exactly 0 (token 0, as
    torch.argmax); a zero weight row has logit 0 (scale 0 in the kernel)."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(200, 16, generator=gen).abs() + 0.01
    weight[7] = 0.0
    hidden = torch.randn(3, 16, generator=gen)
    hidden[1] = 0.0
    hidden[2] = -1.0  # every other logit negative: row 7's 0 wins
    tokens, _ = decide(native, hidden, weight)
    assert tokens == exact_argmax(hidden, weight)
    assert tokens[1:] == [0, 7]


def test_a_large_dimension_keeps_the_integer_dots_exact(native) -> None:
    """dim 4100 cuts the hidden rows to 512 levels, so a dot of every term at
    full scale stays below 2^31; with 2047 levels it would wrap around."""
    dim = 4100
    assert hidden_levels(dim) == 512
    gen = torch.Generator().manual_seed(6)
    weight = torch.randn(500, dim, generator=gen) * 0.01
    weight[100] = 1.0  # every term at full scale, all of one sign
    weight[200] = 1.0 - 1e-3 * torch.rand(dim, generator=gen)
    hidden = torch.ones(3, dim)
    hidden[1] = -1.0
    hidden[2] = torch.randn(dim, generator=gen)
    tokens, _ = decide(native, hidden, weight)
    assert tokens == exact_argmax(hidden, weight)
    assert tokens[0] == 100


def test_bad_arguments_are_refused(native) -> None:
    head = Int16GreedyHead(torch.randn(50, 8), native)
    with pytest.raises(ValueError, match="do not fit"):
        native.int16_lm_head_argmax(torch.zeros(2, 9), head.packed, torch.empty(2 * 64))
    with pytest.raises(ValueError, match="scratch"):
        native.int16_lm_head_argmax(torch.zeros(2, 8), head.packed, torch.empty(10))
    with pytest.raises(ValueError, match="fp32"):
        native.int16_lm_head_argmax(torch.zeros(2, 8, dtype=torch.float64), head.packed, torch.empty(2 * 64))
    with pytest.raises(ValueError, match="non-finite"):
        Int16GreedyHead(torch.full((4, 8), float("inf")), native)
