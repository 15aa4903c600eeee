"""Greedy rows on the bf16 LM head with the exact argmax over its candidates
(models/greedy_head.py, kernels/verified_argmax.cpp): the error bound against
oneDNN's bf16 GEMM, and the model's greedy tokens on it against the
reference. Both verified heads, bf16 and int16 (test_int16_greedy.py has
the int16 one's own cases), against a float64 GEMM + argmax: near-ties their
logits cannot separate, exact ties, vocabulary tails, rows that are not
finite. The bf16 GEMM runs on any oneDNN CPU (emulated where bf16 dot
products are missing) and the int16 kernel has a scalar path, so these run
everywhere; `auto` turns bf16 on only where bf16 dot products are native."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_llm.engine.config import ConfigError, EngineConfig
from python_llm.engine.worker.kernels import CpuKernels
from python_llm.engine.worker.models import build_model, greedy_head
from python_llm.engine.worker.models.greedy_head import (
    GreedyHeads,
    VerifiedGreedyHead,
    bf16_logit_bound,
    verified_greedy_precision,
)
from python_llm.engine.worker.models.packed_linear import packed_linears_available
from tests.unit.engine.test_model_tiny import save_tiny

pytestmark = pytest.mark.skipif(
    not packed_linears_available(torch.device("cpu"), torch.float32), reason="torch built without oneDNN"
)


def exact_argmax(hidden: torch.Tensor, weight: torch.Tensor) -> list[int]:
    return (hidden.double() @ weight.double().t()).argmax(dim=-1).tolist()


@pytest.mark.parametrize("dim", [8, 64, 576, 2048])
@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_every_bf16_logit_is_within_the_bound(dim: int, scale: float) -> None:
    gen = torch.Generator().manual_seed(dim)
    weight = torch.randn(3001, dim, generator=gen) * scale
    hidden = torch.randn(17, dim, generator=gen) * torch.logspace(-2, 2, 17).unsqueeze(1)
    head = VerifiedGreedyHead(weight, kernels=None)  # type: ignore[arg-type]  # its bf16 GEMM alone
    approx = head.packed(hidden.to(torch.bfloat16)).double()
    exact = hidden.double() @ weight.double().t()
    assert head.bound == bf16_logit_bound(dim)
    allowed = head.bound * hidden.double().norm(dim=1, keepdim=True) * weight.double().norm(dim=1)
    worst = ((approx - exact).abs() / allowed).max().item()
    assert worst <= 1.0, f"a bf16 logit's error is {worst:.3f}x its bound"
    # and the bound is not vacuous: errors reach a visible part of it
    assert worst > 1e-3


def test_without_onednn_bf16_the_fp32_fallback_keeps_the_bound_and_the_answers(native, monkeypatch) -> None:
    """On AVX2 CPUs oneDNN refuses bf16 GEMMs: the head then does the same
    arithmetic in fp32 on bf16-rounded values (so these tests run there)."""
    monkeypatch.setattr(greedy_head, "onednn_bf16_gemm", lambda: False)
    gen = torch.Generator().manual_seed(9)
    weight, hidden = torch.randn(2003, 576, generator=gen) * 0.05, torch.randn(9, 576, generator=gen)
    head = VerifiedGreedyHead(weight, native)
    assert isinstance(head.packed, greedy_head.Bf16RoundedLinear)
    approx = head.packed(hidden.to(torch.bfloat16))
    assert approx.dtype == torch.bfloat16
    exact = hidden.double() @ weight.double().t()
    allowed = head.bound * hidden.double().norm(dim=1, keepdim=True) * weight.double().norm(dim=1)
    assert bool(((approx.double() - exact).abs() <= allowed).all())
    assert head(hidden)[0] == exact_argmax(hidden, weight)


def decide(
    native: CpuKernels, hidden: torch.Tensor, weight: torch.Tensor, precision: str
) -> tuple[list[int], list[int]]:
    return GreedyHeads[precision](weight, native)(hidden)


both_heads = pytest.mark.parametrize("precision", sorted(GreedyHeads))


@both_heads
@pytest.mark.parametrize("rows", [1, 3, 7, 64])
@pytest.mark.parametrize("vocab,dim", [(4099, 64), (1007, 576), (37, 13), (1, 8)])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_matches_the_exact_argmax(
    native, threads, rows: int, vocab: int, dim: int, num_threads: int, precision: str
) -> None:
    threads(num_threads)
    gen = torch.Generator().manual_seed(rows * 31 + vocab + dim)
    hidden = torch.randn(rows, dim, generator=gen)
    weight = torch.randn(vocab, dim, generator=gen)
    tokens, candidates = decide(native, hidden, weight, precision)
    assert tokens == exact_argmax(hidden, weight)
    assert all(count >= 1 for count in candidates)


@both_heads
def test_near_ties_the_approximate_logits_cannot_separate_are_dotted_again(native, precision: str) -> None:
    """Weight rows that differ below bf16's or int16's resolution: their
    approximate logits are equal, so every one is a candidate, and the exact winner is found among
    them (at the vocabulary's tail too, past the vector lanes)."""
    gen = torch.Generator().manual_seed(3)
    dim, vocab = 576, 1000
    weight = torch.randn(vocab, dim, generator=gen) * 0.05
    hidden = torch.randn(6, dim, generator=gen)
    twins = [5, 500, 998, 999]
    base = hidden[0] / hidden[0].norm() * 3.0
    for i, row in enumerate(twins):
        weight[row] = base * (1 + 1e-6 * (i + 1))  # the last twin is the exact winner for hidden[0]
    tokens, candidates = decide(native, hidden, weight, precision)
    assert tokens == exact_argmax(hidden, weight)
    assert tokens[0] == 999 and candidates[0] >= len(twins)


@both_heads
def test_exact_ties_go_to_the_first_index(native, precision: str) -> None:
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(300, 32, generator=gen)
    hidden = torch.randn(2, 32, generator=gen)
    weight[40] = weight[270] = hidden[0] * 10
    tokens, candidates = decide(native, hidden, weight, precision)
    assert tokens[0] == 40 and candidates[0] >= 2
    assert tokens == exact_argmax(hidden, weight)


@both_heads
def test_rows_that_are_not_finite_are_left_undecided(native, precision: str) -> None:
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(200, 16, generator=gen)
    hidden = torch.randn(3, 16, generator=gen)
    hidden[1, 4] = float("nan")
    hidden[2, 0] = float("inf")
    tokens, _ = decide(native, hidden, weight, precision)
    assert tokens[0] == exact_argmax(hidden[:1], weight)[0]
    assert tokens[1:] == [-1, -1]


def test_bad_arguments_are_refused(native) -> None:
    head = VerifiedGreedyHead(torch.randn(50, 8), native)
    with pytest.raises(ValueError, match="do not fit"):
        native.verified_argmax(
            torch.zeros(2, 50, dtype=torch.bfloat16), torch.zeros(3, 8), head.weight, head.norms, head.bound
        )
    with pytest.raises(ValueError, match="bf16 logits"):
        native.verified_argmax(torch.zeros(2, 50), torch.zeros(2, 8), head.weight, head.norms, head.bound)
    with pytest.raises(ValueError, match="non-finite"):
        VerifiedGreedyHead(torch.full((4, 8), float("inf")), native)


def test_auto_takes_the_head_the_cpu_runs_fastest_and_each_matches_the_reference(native, tmp_path: Path) -> None:
    """bf16 where bf16 dot products are native, int16 on other AVX2 CPUs,
    else fp32; each verified head is then put in on any CPU and checked."""
    folder = save_tiny(tmp_path / "llama", "llama", tie_word_embeddings=True)
    cpu = torch.device("cpu")
    reference = build_model(folder, 64, torch.float32, cpu, linear_backend="torch", kernels=None, greedy_lm_head="fp32")
    auto = build_model(folder, 64, torch.float32, cpu, linear_backend="auto", kernels=native, greedy_lm_head="auto")
    fp32 = build_model(folder, 64, torch.float32, cpu, linear_backend="auto", kernels=native, greedy_lm_head="fp32")
    precision = verified_greedy_precision(native, cpu, torch.float32)
    int16_faster = native.int16_lm_head_supported() and native.fma_gemm_supported() and native.fma_vector_floats() == 8
    assert precision == ("bf16" if native.bf16_dot_supported() else "int16" if int16_faster else None)
    assert isinstance(auto.greedy_head, GreedyHeads[precision] if precision else type(None))
    assert fp32.greedy_head is None
    gen = torch.Generator().manual_seed(11)
    for name, head_type in GreedyHeads.items():
        auto.use_verified_greedy(name)
        assert isinstance(auto.greedy_head, head_type)
        assert auto.greedy_head.weight.data_ptr() == auto.lm_head.data_ptr()
        for rows in (1, 3, 40):
            hidden = torch.randn(rows, reference.spec.hidden_size, generator=gen)
            with torch.inference_mode():
                expected = reference.compute_logits(hidden).argmax(dim=-1).tolist()
                assert auto.greedy_tokens(hidden) == expected, f"{name}, {rows} rows"
                assert fp32.greedy_tokens(hidden) == expected, f"{rows} rows"
    with pytest.raises(ValueError, match="precision"):
        auto.use_verified_greedy("int8")


def test_a_row_it_cannot_decide_goes_the_fp32_way(native, tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "llama", "llama", tie_word_embeddings=True)
    model = build_model(
        folder, 64, torch.float32, torch.device("cpu"), linear_backend="auto", kernels=native, greedy_lm_head="fp32"
    )
    gen = torch.Generator().manual_seed(12)
    hidden = torch.randn(5, model.spec.hidden_size, generator=gen)
    hidden[2, 1] = float("nan")
    with torch.inference_mode():
        expected = model.greedy_tokens(hidden)
        model.use_verified_greedy()
        assert model.greedy_tokens(hidden) == expected


def test_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match="greedy_lm_head"):
        EngineConfig(model_dir="/m", greedy_lm_head="bf16")
