"""Greedy rows on the int16 LM head with the exact argmax over its candidates
(models/int16_greedy_head.py, kernels/int16_lm_head.cpp): every approximate
logit against its bound (recomputed here from the quantization's
definition), the argmax against a float64 GEMM + argmax (near-ties the int16
logits cannot separate, exact ties, vocabulary tails past the 16-row tiles,
rows of zeros, rows that are not finite, a dimension large enough to cut
the hidden rows' levels), and `auto` taking it where there are no bf16 dot
products. The kernel has a scalar path, so these run on any CPU."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_llm.engine.worker.kernels import CpuKernels
from python_llm.engine.worker.models import build_model
from python_llm.engine.worker.models.greedy_head import VerifiedGreedyHead, verified_greedy_precision
from python_llm.engine.worker.models.int16_greedy_head import Int16GreedyHead

from test_model_tiny import save_tiny

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
    hidden[3, 5] *= 40   # an outlier, as hidden states have
    head = Int16GreedyHead(weight, native)
    head(hidden)
    vocab = weight.shape[0]
    approx = head._scratch[:17 * head.packed.scales.shape[0]].view(17, -1)[:, :vocab].double()
    exact = hidden.double() @ weight.double().t()
    m1, m2 = bound_factors(hidden)
    allowed = m1[:, None] * head.packed.p_factor[:vocab].double() + m2[:, None] * head.packed.q_factor[:vocab].double()
    worst = ((approx - exact).abs() / allowed).max().item()
    assert worst <= 1.0, f"an int16 logit's error is {worst:.3f}x its bound"
    assert worst > 1e-3   # and the bound is not vacuous
    # the padding rows past the vocabulary never raise a row's floor
    assert bool((head.packed.p_factor[vocab:] > 1e29).all())


def decide(native: CpuKernels, hidden: torch.Tensor, weight: torch.Tensor) -> tuple[list[int], list[int]]:
    return Int16GreedyHead(weight, native)(hidden)


@pytest.mark.parametrize("rows", [1, 4, 7, 64])
@pytest.mark.parametrize("vocab,dim", [(4099, 64), (1007, 576), (37, 13), (1, 8)])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_matches_the_exact_argmax(native, threads, rows: int, vocab: int, dim: int, num_threads: int) -> None:
    threads(num_threads)
    gen = torch.Generator().manual_seed(rows * 31 + vocab + dim)
    hidden = torch.randn(rows, dim, generator=gen)
    weight = torch.randn(vocab, dim, generator=gen)
    tokens, candidates = decide(native, hidden, weight)
    assert tokens == exact_argmax(hidden, weight)
    assert all(count >= 1 for count in candidates)


def test_near_ties_the_int16_logits_cannot_separate_are_dotted_again(native) -> None:
    gen = torch.Generator().manual_seed(3)
    dim, vocab = 576, 1000
    weight = torch.randn(vocab, dim, generator=gen) * 0.05
    hidden = torch.randn(6, dim, generator=gen)
    twins = [5, 500, 998, 999]
    base = hidden[0] / hidden[0].norm() * 3.0
    for i, row in enumerate(twins):
        weight[row] = base * (1 + 1e-6 * (i + 1))   # the last twin is the exact winner for hidden[0]
    tokens, candidates = decide(native, hidden, weight)
    assert tokens == exact_argmax(hidden, weight)
    assert tokens[0] == 999 and candidates[0] >= len(twins)


def test_exact_ties_go_to_the_first_index(native) -> None:
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(300, 32, generator=gen)
    hidden = torch.randn(2, 32, generator=gen)
    weight[40] = weight[270] = hidden[0] * 10
    tokens, candidates = decide(native, hidden, weight)
    assert tokens[0] == 40 and candidates[0] >= 2
    assert tokens == exact_argmax(hidden, weight)


def test_zero_rows_and_non_finite_rows(native) -> None:
    """A hidden row of zeros has every logit exactly 0 (token 0, as
    torch.argmax); zero weight rows have logit 0; a row with NaN or inf is
    left to the fp32 way (-1)."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(200, 16, generator=gen)
    weight[7] = 0.0
    hidden = torch.randn(4, 16, generator=gen)
    hidden[1] = 0.0
    hidden[2, 4] = float("nan")
    hidden[3, 0] = float("inf")
    tokens, _ = decide(native, hidden, weight)
    assert tokens[0] == exact_argmax(hidden[:1], weight)[0]
    assert tokens[1:] == [0, -1, -1]


def test_a_large_dimension_keeps_the_integer_dots_exact(native) -> None:
    """dim 4100 cuts the hidden rows to 512 levels, so a dot of every term at
    full scale stays below 2^31; with 2047 levels it would wrap around."""
    dim = 4100
    assert hidden_levels(dim) == 512
    gen = torch.Generator().manual_seed(6)
    weight = torch.randn(500, dim, generator=gen) * 0.01
    weight[100] = 1.0                      # every term at full scale, all of one sign
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


def test_auto_takes_it_without_bf16_dot_products_and_matches_the_reference(native, tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "llama", "llama", tie_word_embeddings=True)
    cpu = torch.device("cpu")
    reference = build_model(folder, 64, torch.float32, cpu, linear_backend="torch", kernels=None, greedy_lm_head="fp32")
    auto = build_model(folder, 64, torch.float32, cpu, linear_backend="auto", kernels=native, greedy_lm_head="auto")
    precision = verified_greedy_precision(native, cpu, torch.float32)
    expected_head = {"bf16": VerifiedGreedyHead, "int16": Int16GreedyHead, None: type(None)}[precision]
    assert isinstance(auto.greedy_head, expected_head)
    assert precision == ("bf16" if native.bf16_dot_supported() else
                         "int16" if native.int16_lm_head_supported() else None)
    auto.use_verified_greedy("int16")   # on any CPU, so the path is checked here too
    assert isinstance(auto.greedy_head, Int16GreedyHead)
    assert auto.greedy_head.weight.data_ptr() == auto.lm_head.data_ptr()
    gen = torch.Generator().manual_seed(11)
    for rows in (1, 3, 40):
        hidden = torch.randn(rows, reference.spec.hidden_size, generator=gen)
        with torch.inference_mode():
            expected = reference.compute_logits(hidden).argmax(dim=-1).tolist()
            assert auto.greedy_tokens(hidden) == expected, f"{rows} rows"
    with pytest.raises(ValueError, match="precision"):
        auto.use_verified_greedy("int8")
