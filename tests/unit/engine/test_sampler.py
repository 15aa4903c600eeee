"""Sampler semantics on hand-made logits (no model needed)."""

from __future__ import annotations

import math

import pytest
import torch

from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.worker.input_batch import CachedRequestState
from python_llm.engine.worker.kernels import cpu_kernels
from python_llm.engine.worker.sampler import Sampler

VOCAB = 32


def seq(
    request_id: str = "r",
    output: list[int] | None = None,
    prompt: list[int] | None = None,
    generator: torch.Generator | None = None,
    **params,
) -> CachedRequestState:
    """The runner's state of a request with these tokens (prompt, then output);
    greedy unless `params` say otherwise."""
    prompt = prompt or []
    sampling = SamplingParams(**{"temperature": 0.0, **params})
    return CachedRequestState(request_id, prompt + (output or []), len(prompt), sampling, [0], generator=generator)


def logits_rows(*rows: list[float]) -> torch.Tensor:
    out = torch.full((len(rows), VOCAB), -5.0)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row)
    return out


@pytest.fixture
def sampler() -> Sampler:
    return Sampler("cpu")


def test_greedy_picks_argmax_per_row(sampler: Sampler) -> None:
    logits = logits_rows([0.0, 3.0, 1.0], [5.0, 1.0])
    assert sampler(logits, [seq("a"), seq("b")]).token_ids == [1, 0]


def test_logprob_is_log_softmax_of_chosen(sampler: Sampler) -> None:
    logits = logits_rows([0.0, 3.0, 1.0])
    expected = torch.log_softmax(logits[0], -1)[1].item()
    result = sampler(logits.clone(), [seq(return_log_probs=True)])
    assert result.logprobs[0] == pytest.approx(expected, abs=1e-6)
    assert sampler(logits.clone(), [seq()]).logprobs == [None]


def test_repetition_penalty_matches_hf(sampler: Sampler) -> None:
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(1, VOCAB) * 3
    prompt, output = [1, 2, 3], [3, 4, 7]
    expected = RepetitionPenaltyLogitsProcessor(1.3)(torch.tensor([prompt + output]), logits.clone())
    processed = logits.clone()
    sampler._process(processed, [seq(prompt=prompt, output=output, repetition_penalty=1.3)], [True])
    assert torch.allclose(processed, expected)


def test_presence_and_frequency_penalties_follow_openai(sampler: Sampler) -> None:
    logits = torch.zeros(1, VOCAB)
    sampler._process(
        logits, [seq(prompt=[9, 9], output=[4, 4, 4, 5], presence_penalty=0.5, frequency_penalty=0.25)], [True]
    )
    assert logits[0, 4].item() == pytest.approx(-(0.5 + 3 * 0.25))
    assert logits[0, 5].item() == pytest.approx(-(0.5 + 0.25))
    assert logits[0, 9].item() == 0.0  # prompt tokens are not penalised


def test_min_tokens_masks_stop_tokens_until_reached(sampler: Sampler) -> None:
    logits = logits_rows([0.0, 0.0, 9.0])
    before = seq(output=[1], min_tokens=2, stop_token_ids=[2])
    after = seq(output=[1, 1], min_tokens=2, stop_token_ids=[2])
    assert sampler(logits.clone(), [before]).token_ids != [2]
    assert sampler(logits.clone(), [after]).token_ids == [2]


def test_bad_words_single_and_multi_token(sampler: Sampler) -> None:
    logits = logits_rows([0.0, 1.0, 2.0, 3.0, 9.0])
    banned_single = seq(bad_words_ids=[[4]])
    assert sampler(logits.clone(), [banned_single]).token_ids == [3]
    # [1, 4] banned: 4 is forbidden only right after 1 (prompt tail counts)
    after_one = seq(prompt=[1], bad_words_ids=[[1, 4]])
    after_two = seq(prompt=[2], bad_words_ids=[[1, 4]])
    assert sampler(logits.repeat(2, 1), [after_one, after_two]).token_ids == [3, 4]
    # longer prefix spanning prompt and output
    spanning = seq(prompt=[7, 1], output=[2], bad_words_ids=[[1, 2, 4]])
    assert sampler(logits.clone(), [spanning]).token_ids == [3]


def test_logits_processor_hook_runs_per_sequence(sampler: Sampler) -> None:
    seen: list[list[int]] = []

    def only_token_5(output_ids: list[int], row: torch.Tensor) -> torch.Tensor:
        seen.append(list(output_ids))
        mask = torch.full_like(row, -math.inf)
        mask[5] = 0
        return row + mask

    logits = logits_rows([9.0])
    hooked = seq("a", output=[1, 2], logits_processors=[only_token_5])
    assert sampler(logits.repeat(2, 1), [hooked, seq("b")]).token_ids == [5, 0]
    assert seen == [[1, 2]]


def test_top_k_limits_support(sampler: Sampler) -> None:
    logits = torch.tensor([[4.0, 3.9, 3.8, 3.7] + [0.0] * (VOCAB - 4)]).repeat(200, 1)
    seqs = [seq(f"r{i}", temperature=1.0, top_k=2) for i in range(200)]
    tokens = set(sampler(logits, seqs).token_ids)
    assert tokens == {0, 1}


def test_top_p_keeps_smallest_covering_set(sampler: Sampler) -> None:
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05] + [0.0] * (VOCAB - 4)) + 1e-12
    logits = probs.log().unsqueeze(0).repeat(300, 1)
    seqs = [seq(f"r{i}", temperature=1.0, top_p=0.75) for i in range(300)]
    assert set(sampler(logits, seqs).token_ids) == {0, 1}


def test_top_k_and_top_p_mixed_with_plain_rows(sampler: Sampler) -> None:
    logits = torch.tensor([[4.0, 3.9, 3.8, 3.7] + [-9.0] * (VOCAB - 4)]).repeat(300, 1)
    seqs = [seq(f"r{i}", temperature=1.0, top_k=1 if i % 3 == 0 else 0, top_p=0.99) for i in range(300)]
    tokens = sampler(logits, seqs).token_ids
    assert {t for i, t in enumerate(tokens) if i % 3 == 0} == {0}
    assert len({t for i, t in enumerate(tokens) if i % 3}) > 1


def test_sampling_follows_softmax_of_scaled_logits(sampler: Sampler) -> None:
    torch.manual_seed(1)
    base = torch.tensor([1.0, 0.0, -1.0] + [-30.0] * (VOCAB - 3))
    n = 4000
    tokens = torch.tensor(sampler(base.repeat(n, 1), [seq(f"r{i}", temperature=0.5) for i in range(n)]).token_ids)
    expected = torch.softmax(base / 0.5, -1)[:3]
    observed = torch.bincount(tokens, minlength=VOCAB)[:3].float() / n
    assert torch.allclose(observed, expected, atol=0.03)


def test_seeded_request_is_reproducible_across_batches(sampler: Sampler) -> None:
    torch.manual_seed(2)
    row = torch.randn(VOCAB)

    def draw(batch_size: int, position: int) -> list[int]:
        gen = torch.Generator().manual_seed(1234)
        tokens = []
        for _ in range(10):
            seqs = [seq(f"other{i}", temperature=1.0) for i in range(batch_size)]
            seqs.insert(position, seq("seeded", temperature=1.0, seed=1234, generator=gen))
            out = sampler(row.repeat(batch_size + 1, 1), seqs).token_ids
            tokens.append(out[position])
        return tokens

    alone = draw(0, 0)
    assert draw(5, 3) == alone
    assert draw(2, 2) == alone
    assert len(set(alone)) > 1  # the draws really are random


def test_logprob_of_sampled_token_uses_processed_distribution(sampler: Sampler) -> None:
    logits = torch.tensor([[2.0, 1.0] + [-50.0] * (VOCAB - 2)])
    result = sampler(logits.clone(), [seq(temperature=2.0, top_k=1, return_log_probs=True)])
    assert result.token_ids == [0]
    assert result.logprobs[0] == pytest.approx(0.0, abs=1e-6)  # only one token left after top-k


def test_rows_must_match_sequences(sampler: Sampler) -> None:
    with pytest.raises(ValueError, match=r"^logits rows \(2\) != sequences \(1\)$"):
        sampler(torch.zeros(2, VOCAB), [seq()])


# --- the CPU argmax ---------------------------------------------------------------
ARGMAX_VOCABS = [49152, 49153, 5000, 1003]  # a multiple of the 8-wide lanes, and ragged tails


def tricky_logits(vocab: int, seed: int) -> torch.Tensor:
    """Random rows plus the cases an argmax gets wrong: ties (first wins),
    a maximum in the short last chunk, a NaN (counts as the maximum)."""
    x = torch.randn(6, vocab, generator=torch.Generator().manual_seed(seed))
    x[1, [7, vocab - 1]] = 50.0  # tie across chunks
    x[2, [600, 601]] = 50.0  # tie inside a chunk
    x[3, vocab - 1] = 60.0  # the last column
    x[4, 1000] = float("nan")
    x[5, :] = 1.0  # all equal
    return x


@pytest.mark.parametrize("vocab", ARGMAX_VOCABS)
def test_native_argmax_equals_torch(vocab: int) -> None:
    kernels = cpu_kernels()
    assert kernels is not None, "the CPU kernels did not build on this machine"
    x = tricky_logits(vocab, 0)
    assert torch.equal(kernels.argmax_rows(x), x.argmax(dim=-1))
    # the sampler's greedy path uses it, on a strided view too
    sampler = Sampler("cpu", kernels)
    seqs = [seq(f"r{i}") for i in range(x.shape[0])]
    assert sampler(x.clone(), seqs).token_ids == x.argmax(dim=-1).tolist()
    wide = torch.cat([x, torch.zeros(x.shape[0], 3)], dim=1)[:, :vocab]
    assert torch.equal(sampler.argmax(wide), x.argmax(dim=-1))


@pytest.mark.parametrize(
    "params, outputs, plain",
    [
        (SamplingParams(temperature=0.0), 0, True),
        (SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[2]), 2, False),  # EOS still banned
        (SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[2]), 3, True),
        (SamplingParams(temperature=0.0, min_tokens=3), 0, True),  # nothing to ban
        (SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[]), 0, True),  # explicitly none
        (SamplingParams(temperature=0.7), 0, False),
        (SamplingParams(temperature=0.0, return_log_probs=True), 0, False),
        (SamplingParams(temperature=0.0, repetition_penalty=1.1), 0, False),
        (SamplingParams(temperature=0.0, bad_words_ids=[[5]]), 0, False),
    ],
)
def test_plain_greedy_decides_the_fused_path(params: SamplingParams, outputs: int, plain: bool) -> None:
    """The runner fuses LM head + argmax only when the sampler would take a
    plain argmax of the raw logits; the output counted is the runner's own
    (prompt tokens do not count)."""
    state = CachedRequestState("r", [7, 7] + list(range(outputs)), 2, params, [0])
    assert Sampler.plain_greedy([state]) is plain
    assert Sampler.plain_greedy([seq(), state]) is plain
