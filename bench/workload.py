"""The benchmark workload: random prompts of random token ids and random
output lengths, reproducible from one seed, identical for every method."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer


@dataclass(frozen=True)
class WorkloadSpec:
    num_requests: int = 64
    min_prompt_tokens: int = 32
    max_prompt_tokens: int = 256  # inclusive
    min_output_tokens: int = 16
    max_output_tokens: int = 128  # inclusive
    seed: int = 0

    def __post_init__(self) -> None:
        if self.num_requests <= 0:
            raise ValueError(f"num_requests: must be > 0, got {self.num_requests}")
        if not 0 < self.min_prompt_tokens <= self.max_prompt_tokens:
            raise ValueError(
                f"prompt tokens: need 0 < min <= max, got {self.min_prompt_tokens}..{self.max_prompt_tokens}"
            )
        if not 0 < self.min_output_tokens <= self.max_output_tokens:
            raise ValueError(
                f"output tokens: need 0 < min <= max, got {self.min_output_tokens}..{self.max_output_tokens}"
            )


@dataclass(frozen=True)
class BenchRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int  # generated exactly (EOS ignored)


@dataclass(frozen=True)
class Vocabulary:
    """Which ids a random prompt may use: [0, size) minus the special ids
    (a stray `<|im_end|>` in a prompt would be an odd request, and the text
    sent to Triton would not round-trip)."""

    size: int
    special_ids: frozenset[int]

    @classmethod
    def from_model_dir(cls, model_dir: str | Path) -> Vocabulary:
        folder = Path(model_dir)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        model_vocab = int(json.loads((folder / "config.json").read_text())["vocab_size"])
        special = {i for i, token in tokenizer.get_added_tokens_decoder().items() if token.special}
        # the embedding may be padded past the tokenizer: those rows are no tokens
        return cls(size=min(model_vocab, tokenizer.get_vocab_size()), special_ids=frozenset(special))

    def usable_ids(self) -> list[int]:
        ids = [i for i in range(self.size) if i not in self.special_ids]
        if not ids:
            raise ValueError("vocabulary: no usable (non-special) ids")
        return ids


def make_workload(spec: WorkloadSpec, vocab: Vocabulary) -> list[BenchRequest]:
    rng = random.Random(spec.seed)
    usable = vocab.usable_ids()
    requests = []
    for _ in range(spec.num_requests):
        prompt_len = rng.randint(spec.min_prompt_tokens, spec.max_prompt_tokens)
        max_tokens = rng.randint(spec.min_output_tokens, spec.max_output_tokens)
        prompt = tuple(rng.choice(usable) for _ in range(prompt_len))
        requests.append(BenchRequest(prompt_ids=prompt, max_tokens=max_tokens))
    return requests


def total_output_tokens(requests: list[BenchRequest]) -> int:
    return sum(r.max_tokens for r in requests)


def total_prompt_tokens(requests: list[BenchRequest]) -> int:
    return sum(len(r.prompt_ids) for r in requests)
