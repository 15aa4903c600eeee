"""The benchmark workload generator: reproducible, in range, no special ids."""

from __future__ import annotations

import pytest

from bench.workload import Vocabulary, WorkloadSpec, make_workload, total_output_tokens, total_prompt_tokens

VOCAB = Vocabulary(size=500, special_ids=frozenset(range(17)) | {499})


def test_same_seed_same_workload_other_seed_other_workload() -> None:
    spec = WorkloadSpec(seed=7)
    first, again = make_workload(spec, VOCAB), make_workload(spec, VOCAB)
    assert first == again
    other = make_workload(WorkloadSpec(seed=8), VOCAB)
    assert [r.prompt_ids for r in other] != [r.prompt_ids for r in first]


def test_counts_and_lengths_in_range() -> None:
    spec = WorkloadSpec(
        num_requests=200,
        min_prompt_tokens=32,
        max_prompt_tokens=256,
        min_output_tokens=16,
        max_output_tokens=128,
        seed=3,
    )
    requests = make_workload(spec, VOCAB)
    assert len(requests) == 200
    prompt_lengths = [len(r.prompt_ids) for r in requests]
    outputs = [r.max_tokens for r in requests]
    assert min(prompt_lengths) >= 32 and max(prompt_lengths) <= 256
    assert min(outputs) >= 16 and max(outputs) <= 128
    # uniform over the range, not stuck at one value: 200 draws spread widely
    assert max(prompt_lengths) - min(prompt_lengths) > 150
    assert max(outputs) - min(outputs) > 80
    assert total_prompt_tokens(requests) == sum(prompt_lengths)
    assert total_output_tokens(requests) == sum(outputs)


def test_no_special_ids_and_ids_inside_vocabulary() -> None:
    requests = make_workload(WorkloadSpec(num_requests=100, seed=11), VOCAB)
    used = {t for r in requests for t in r.prompt_ids}
    assert not used & VOCAB.special_ids
    assert min(used) >= 0 and max(used) < VOCAB.size
    # most of the usable vocabulary shows up in ~14k draws from 483 ids
    assert len(used) > 400


def test_vocabulary_without_usable_ids_is_rejected() -> None:
    with pytest.raises(ValueError, match="no usable"):
        make_workload(WorkloadSpec(num_requests=1), Vocabulary(size=3, special_ids=frozenset({0, 1, 2})))


@pytest.mark.parametrize(
    "fields",
    [
        {"num_requests": 0},
        {"min_prompt_tokens": 0},
        {"min_prompt_tokens": 300, "max_prompt_tokens": 256},
        {"min_output_tokens": 200, "max_output_tokens": 128},
    ],
)
def test_bad_spec_is_rejected(fields: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        WorkloadSpec(**fields)


def test_vocabulary_from_a_tokenizer_folder(tmp_path) -> None:
    """Special ids come from tokenizer.json's added tokens; the size is the
    smaller of the tokenizer's and the model's vocabulary."""
    from tokenizers import AddedToken, Tokenizer, models

    tokenizer = Tokenizer(models.WordLevel({"a": 0, "b": 1, "c": 2, "d": 3}, unk_token="a"))
    tokenizer.add_special_tokens([AddedToken("<eos>", special=True)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "config.json").write_text('{"vocab_size": 8}')
    vocab = Vocabulary.from_model_dir(tmp_path)
    assert vocab.size == 5
    assert vocab.special_ids == frozenset({4})
    assert vocab.usable_ids() == [0, 1, 2, 3]
