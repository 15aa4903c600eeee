"""The native LM head fused with the greedy argmax, against a float64
GEMM + torch.argmax: tile edges (rows, vocabulary, hidden size not multiples
of the tile), thread counts, ties across thread slices, NaN, bad arguments."""

from __future__ import annotations

import pytest
import torch


def reference(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (hidden.double() @ weight.double().t()).argmax(dim=-1)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 64])
@pytest.mark.parametrize("vocab,dim", [(4099, 64), (1001, 576), (37, 13), (1, 8), (6, 3)])
@pytest.mark.parametrize("num_threads", [1, 2])
def test_matches_gemm_then_argmax(native, threads, rows: int, vocab: int, dim: int, num_threads: int) -> None:
    threads(num_threads)
    gen = torch.Generator().manual_seed(rows * 7919 + vocab + dim)
    hidden = torch.randn(rows, dim, generator=gen)
    weight = torch.randn(vocab, dim, generator=gen)
    assert native.lm_head_argmax(hidden, weight) == reference(hidden, weight).tolist()


def test_strided_rows(native) -> None:
    """Rows taken out of a wider buffer (the sampled rows of a step)."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(5, 100, generator=gen)
    weight = torch.randn(300, 80, generator=gen)
    hidden = wide[:, 10:90]
    assert hidden.stride(0) == 100
    assert native.lm_head_argmax(hidden, weight) == reference(hidden, weight).tolist()


def test_ties_take_the_first_index_across_thread_slices(native, threads) -> None:
    threads(2)
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(1000, 64, generator=gen) * 0.01
    hidden = torch.randn(3, 64, generator=gen)
    best = hidden[0].sign()  # the largest logit for row 0, copied to both threads' slices
    for index in (998, 17, 600):
        weight[index] = best
    ids = native.lm_head_argmax(hidden, weight)
    assert ids[0] == 17
    assert ids == reference(hidden, weight).tolist()


def test_nan_counts_as_the_maximum(native, threads) -> None:
    threads(2)
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(500, 32, generator=gen)
    hidden = torch.randn(2, 32, generator=gen)
    weight[[410, 120], 5] = float("nan")  # every row's logits 120 and 410 are NaN
    expected = (hidden @ weight.t()).argmax(dim=-1)
    assert expected.tolist() == [120, 120]
    assert native.lm_head_argmax(hidden, weight) == expected.tolist()


def test_no_rows(native) -> None:
    assert native.lm_head_argmax(torch.empty(0, 16), torch.randn(10, 16)) == []


def test_rejects_bad_arguments(native) -> None:
    weight = torch.randn(10, 16)
    with pytest.raises(ValueError, match="hidden"):
        native.lm_head_argmax(torch.randn(2, 8), weight)
    with pytest.raises(ValueError, match="fp32"):
        native.lm_head_argmax(torch.randn(2, 16, dtype=torch.bfloat16), weight)
    with pytest.raises(ValueError, match="contiguous rows"):
        native.lm_head_argmax(torch.randn(16, 2).t(), weight)
    with pytest.raises(ValueError, match="hidden"):
        native.lm_head_argmax(torch.randn(16), weight)
