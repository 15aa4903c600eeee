"""One measuring harness for every engine that has an add / step loop: this
project's `LLMEngine` and vLLM's `LLMEngine` (the loop `LLM.generate` runs).

Standard library only and no relative imports: the vLLM runner loads this
file inside its own venv (`build/vllm-venv`), where the project is not
installed, and `bench.vllm_cpu` imports it in the project's venv.

An engine is wrapped as a `Stepper`:
  add(request_id, prompt_ids, max_tokens)  greedy, EOS ignored, exactly max_tokens
  step() -> [(request_id, new_token_ids, finished), ...]
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Protocol


class Stepper(Protocol):
    def add(self, request_id: str, prompt_ids: list[int], max_tokens: int) -> None: ...

    def step(self) -> list[tuple[str, list[int], bool]]: ...


@dataclass
class OfflineRun:
    """All requests submitted at once, then step() until every one ends."""

    tokens: list[list[int]]  # per request, in workload order
    seconds: float  # first add_request .. last token
    steps: int

    @property
    def output_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def run_all_at_once(engine: Stepper, requests: list[tuple[list[int], int]], prefix: str = "bench") -> OfflineRun:
    """The clock starts before the first `add`: vLLM's engine core (another
    process) starts on a request as soon as it is added, so submission belongs
    to the measured time (for this project's engine it is a few ms)."""
    ids = [f"{prefix}-{i}" for i in range(len(requests))]
    index = {rid: i for i, rid in enumerate(ids)}
    tokens: list[list[int]] = [[] for _ in requests]
    pending = len(requests)
    steps = 0
    started = time.perf_counter()
    for rid, (prompt, max_tokens) in zip(ids, requests):
        engine.add(rid, list(prompt), max_tokens)
    while pending:
        for rid, new_ids, finished in engine.step():
            tokens[index[rid]].extend(new_ids)
            pending -= bool(finished)
        steps += 1
    seconds = time.perf_counter() - started
    for (_prompt, max_tokens), got in zip(requests, tokens):
        if len(got) != max_tokens:
            raise RuntimeError(f"a request produced {len(got)} tokens, {max_tokens} were forced (EOS ignored)")
    return OfflineRun(tokens=tokens, seconds=seconds, steps=steps)


@dataclass
class SingleRequestRun:
    """One request alone on an idle engine, streamed through step()."""

    prompt_tokens: int
    output_tokens: int
    ttft_s: float  # add_request .. the step() output carrying the first token
    total_s: float  # add_request .. the last token

    @property
    def decode_tokens_per_s(self) -> float:
        rest = self.output_tokens - 1
        return rest / (self.total_s - self.ttft_s) if rest > 0 and self.total_s > self.ttft_s else 0.0


def run_single(engine: Stepper, prompt: list[int], max_tokens: int, request_id: str) -> SingleRequestRun:
    first = None
    count = 0
    finished = False
    started = time.perf_counter()
    engine.add(request_id, list(prompt), max_tokens)
    while not finished:
        for rid, new_ids, done in engine.step():
            if rid != request_id:
                continue
            if new_ids and first is None:
                first = time.perf_counter()
            count += len(new_ids)
            finished = finished or bool(done)
    total = time.perf_counter() - started
    if first is None or count != max_tokens:
        raise RuntimeError(f"single request: {count} tokens, {max_tokens} were forced")
    return SingleRequestRun(prompt_tokens=len(prompt), output_tokens=count, ttft_s=first - started, total_s=total)


@dataclass
class SingleRequestSummary:
    runs: list[SingleRequestRun] = field(default_factory=list)

    def as_dict(self) -> dict:
        if not self.runs:
            return {"runs": 0}
        ttft = [r.ttft_s * 1e3 for r in self.runs]
        decode = [r.decode_tokens_per_s for r in self.runs]
        return {
            "runs": len(self.runs),
            "max_tokens": self.runs[0].output_tokens,
            "prompt_tokens": [r.prompt_tokens for r in self.runs],
            "ttft_ms": ttft,
            "ttft_ms_median": statistics.median(ttft),
            "ttft_ms_mean": statistics.fmean(ttft),
            "decode_tok_s_median": statistics.median(decode),
        }


def run_singles(
    engine: Stepper, prompts: list[list[int]], max_tokens: int, prefix: str = "single"
) -> SingleRequestSummary:
    summary = SingleRequestSummary()
    for i, prompt in enumerate(prompts):
        summary.runs.append(run_single(engine, prompt, max_tokens, f"{prefix}-{i}"))
    return summary


def warm_up_prompt(requests: list[tuple[list[int], int]]) -> list[int]:
    """A short warm-up prompt that starts no prompt of the workload (so the
    measured run gets no prefix-cache hit from it)."""
    return list(reversed(requests[0][0][:16]))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two outputs differ; None when identical."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))
