"""Reusable test helpers for the model runner, plus tests of the helpers.

- `RunnerDriver`: a hand-written stand-in for the scheduler (contiguous block
  tables, optional chunked prefill, staggered arrivals) that feeds a real
  ModelRunner SchedulerOutputs (a request whole once, then its progress) and
  collects the tokens.
- `assert_same_or_near_tie`: two greedy token sequences for the same prompt
  must be equal, or first differ where the reference logits have a near-tie
  (top-2 gap below `max_gap`), the one legitimate reason batched and single
  runs may part ways in floating point.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pytest
import torch

from python_llm.engine.core.sampling_params import SamplingParams
from tests.unit.engine.seam_messages import new_request, step

# ids → next-token logits [vocab] for the whole sequence `ids`
LogitsFn = Callable[[Sequence[int]], torch.Tensor]


def first_divergence(a: Sequence[int], b: Sequence[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def divergence_is_near_tie(
    logits_fn: LogitsFn, prompt: Sequence[int], a: Sequence[int], b: Sequence[int], max_gap: float = 1e-3
) -> tuple[bool, str]:
    """(ok, explanation). ok when a == b, or at their first difference both
    tokens are the reference's top-2 and their logits lie within max_gap."""
    i = first_divergence(a, b)
    if i is None:
        return True, "identical"
    if i >= min(len(a), len(b)):
        return False, f"lengths differ ({len(a)} vs {len(b)}) with equal common part"
    logits = logits_fn(list(prompt) + list(a[:i])).float()
    top2 = logits.topk(2)
    gap = float(top2.values[0] - top2.values[1])
    top_ids = set(top2.indices.tolist())
    ok = gap < max_gap and {a[i], b[i]} <= top_ids
    return ok, f"diverge at {i}: {a[i]} vs {b[i]}, reference top-2 {top2.indices.tolist()} gap {gap:.2e}"


def assert_same_or_near_tie(
    logits_fn: LogitsFn, prompt: Sequence[int], a: Sequence[int], b: Sequence[int], max_gap: float = 1e-3
) -> None:
    ok, why = divergence_is_near_tie(logits_fn, prompt, a, b, max_gap)
    assert ok, why


@dataclass
class DrivenRequest:
    request_id: str
    prompt: list[int]
    max_new: int
    block_table: list[int]
    sampling: SamplingParams
    arrive_step: int = 0
    start_position: int = 0  # > 0: the first blocks already hold the prompt's prefix
    output: list[int] = field(default_factory=list)
    fed: int = 0  # prompt tokens whose K/V are in the cache
    sent: bool = False  # the runner holds it

    def __post_init__(self) -> None:
        self.fed = self.start_position

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_new


class RunnerDriver:
    """Schedules by hand: decodes first, then prefill chunks of `chunk` tokens."""

    def __init__(self, runner, chunk: int | None = None) -> None:
        self.runner = runner
        self.chunk = chunk
        self.requests: list[DrivenRequest] = []
        self.next_block = 0
        # per step, in batch order: (request id, first position, tokens, sampled)
        self.steps: list[list[tuple[str, int, int, bool]]] = []

    def blocks_for(self, num_tokens: int) -> list[int]:
        count = -(-num_tokens // self.runner.block_size)
        if self.next_block + count > self.runner.num_blocks:
            raise RuntimeError("test driver ran out of KV blocks")
        table = list(range(self.next_block, self.next_block + count))
        self.next_block += count
        return table

    def add(
        self,
        request_id: str,
        prompt: Sequence[int],
        max_new: int,
        sampling: SamplingParams | None = None,
        arrive_step: int = 0,
        block_table: list[int] | None = None,
        start_position: int = 0,
    ) -> DrivenRequest:
        table = block_table if block_table is not None else self.blocks_for(len(prompt) + max_new)
        request = DrivenRequest(
            request_id,
            list(prompt),
            max_new,
            table,
            sampling or SamplingParams(temperature=0.0),
            arrive_step,
            start_position,
        )
        self.requests.append(request)
        return request

    def run(self) -> dict[str, list[int]]:
        step_index = 0
        while not all(r.done for r in self.requests):
            live = [r for r in self.requests if not r.done and r.arrive_step <= step_index]
            cached, new = [], []
            # (request, first position, tokens, sampled): decodes, chunks of
            # requests the runner holds, then new ones (the batch order)
            held_chunks, new_chunks = [], []
            for r in live:
                if r.fed >= len(r.prompt):
                    position = len(r.prompt) + len(r.output) - 1
                    cached.append((r.request_id, position, 1, None))
                    held_chunks.append((r, position, 1, True))
            for r in live:
                if r.fed >= len(r.prompt):
                    continue
                end = len(r.prompt) if self.chunk is None else min(len(r.prompt), r.fed + self.chunk)
                chunk = (r, r.fed, end - r.fed, end == len(r.prompt))
                if r.sent:
                    cached.append((r.request_id, r.fed, end - r.fed, None))
                    held_chunks.append(chunk)
                else:
                    new.append(
                        (new_request(r.request_id, r.prompt, r.block_table, r.fed, sampling=r.sampling), end - r.fed)
                    )
                    new_chunks.append(chunk)
                r.fed, r.sent = end, True
            chunks = held_chunks + new_chunks
            self.steps.append([(r.request_id, start, n, sample) for r, start, n, sample in chunks])
            result = self.runner.execute(step(new, cached, finished=[r.request_id for r in self.requests if r.done]))
            for (r, *_), token in zip([c for c in chunks if c[3]], result.token_ids, strict=True):
                r.output.append(token)
            step_index += 1
        self.runner.execute(step(finished=[r.request_id for r in self.requests]))
        return {r.request_id: r.output for r in self.requests}


# --- tests of the helpers themselves ---------------------------------------
def _fake_logits(gap: float) -> LogitsFn:
    def fn(ids: Sequence[int]) -> torch.Tensor:
        logits = torch.zeros(10)
        logits[3], logits[4] = 5.0, 5.0 - gap
        return logits

    return fn


def test_identical_sequences_pass() -> None:
    assert divergence_is_near_tie(_fake_logits(1.0), [1], [3, 3], [3, 3])[0]


@pytest.mark.parametrize("gap, expected", [(1e-5, True), (0.5, False)])
def test_divergence_judged_by_top2_gap(gap: float, expected: bool) -> None:
    ok, why = divergence_is_near_tie(_fake_logits(gap), [1], [3, 3], [3, 4])
    assert ok is expected, why


def test_divergence_to_a_token_outside_top2_fails() -> None:
    assert not divergence_is_near_tie(_fake_logits(1e-5), [1], [3], [7])[0]


def test_different_lengths_fail() -> None:
    assert not divergence_is_near_tie(_fake_logits(1e-5), [1], [3], [3, 3])[0]
