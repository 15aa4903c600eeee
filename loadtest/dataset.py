"""Prompts for load tests, drawn with a long-tailed length distribution.

LLM traffic is long-tailed: most prompts are short, a few are long, and output
lengths follow a log-normal. The dataset is JSONL: {"prompt": ..., "lang": ...}.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path

# Prompt length classes by characters, and how often each is drawn.
LENGTH_BUCKETS = (("short", 0, 60, 0.6), ("medium", 60, 200, 0.3), ("long", 200, 10**9, 0.1))


@dataclass(frozen=True)
class Prompt:
    text: str
    lang: str
    max_tokens: int


class PromptDataset:
    def __init__(
        self, prompts: list[dict[str, str]], max_tokens: int, fixed_max_tokens: bool = False, seed: int | None = None
    ) -> None:
        if not prompts:
            raise ValueError("the prompt dataset is empty")
        self._buckets: list[tuple[list[dict[str, str]], float]] = []
        for _, low, high, weight in LENGTH_BUCKETS:
            members = [p for p in prompts if low <= len(p["prompt"]) < high]
            if members:
                self._buckets.append((members, weight))
        self._max_tokens = max_tokens
        self._fixed = fixed_max_tokens
        self._rng = random.Random(seed)

    @classmethod
    def from_jsonl(
        cls, path: str | Path, max_tokens: int, fixed_max_tokens: bool = False, seed: int | None = None
    ) -> PromptDataset:
        prompts = []
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), start=1):
            if not line.strip():
                continue
            record = json.loads(line)
            if not isinstance(record.get("prompt"), str) or not record["prompt"]:
                raise ValueError(f"{path}:{number}: each line needs a non-empty 'prompt'")
            prompts.append({"prompt": record["prompt"], "lang": str(record.get("lang", "?"))})
        return cls(prompts, max_tokens, fixed_max_tokens, seed)

    def output_length(self) -> int:
        """Log-normal with its median at a quarter of the cap: mostly short answers, some long."""
        if self._fixed:
            return self._max_tokens
        median = max(1.0, self._max_tokens / 4)
        drawn = self._rng.lognormvariate(math.log(median), 0.8)
        return int(min(self._max_tokens, max(1, round(drawn))))

    def sample(self) -> Prompt:
        members = self._rng.choices([b for b, _ in self._buckets], weights=[w for _, w in self._buckets])[0]
        record = self._rng.choice(members)
        return Prompt(record["prompt"], record["lang"], self.output_length())
