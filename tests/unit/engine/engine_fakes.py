"""A FakeRunner for engine tests: deterministic tokens, and a check of the
KV bookkeeping on every step.

It keeps one token id per KV slot. Each step it first checks that every slot
before the fed chunk (the cached prefix, or recomputed history) holds the
sequence's own token, then writes the chunk's tokens into their slots. A
block freed while still in use, a wrong prefix-cache hit or a bad block table
therefore raises KVCheckError, which kills the engine and fails the test.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass, field
from typing import Callable

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.scheduler_output import RunnerOutput, SchedulerOutput

EOS = 2
VOCAB = 1000


class KVCheckError(AssertionError):
    pass


def default_token(request_id: str, output_index: int) -> int:
    """Never EOS, never below 10, differs per request and position."""
    return 10 + (zlib.crc32(request_id.encode()) + 7919 * output_index) % (VOCAB - 10)


def expected_tokens(request_id: str, n: int) -> list[int]:
    return [default_token(request_id, i) for i in range(n)]


@dataclass
class FakeModelInfo:
    max_model_len: int = 2048
    vocab_size: int = VOCAB
    eos_token_ids: list[int] = field(default_factory=lambda: [EOS])


class FakeRunner:
    def __init__(self, num_blocks: int, block_size: int = 16, *,
                 token_fn: Callable[[str, int], int] = default_token,
                 check_kv: bool = True, fail_at_step: int | None = None,
                 max_model_len: int = 2048, model_seconds: float = 0.0) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.model_info = FakeModelInfo(max_model_len=max_model_len)
        self.token_fn = token_fn
        self.check_kv = check_kv
        self.fail_at_step = fail_at_step
        self.model_seconds = model_seconds
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.steps = 0
        self.batch_sizes: list[int] = []
        self.num_batched_tokens: list[int] = []
        self.dropped_ids: list[str] = []
        self.history: list[list[tuple[str, int, int, bool]]] = []   # per step: (id, start, n, sample)

    @classmethod
    def for_config(cls, config: EngineConfig, **kwargs: object) -> "FakeRunner":
        return cls(config.num_cpu_blocks, config.block_size, **kwargs)  # type: ignore[arg-type]

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("fake runner failure")
        if scheduled.is_empty:
            raise KVCheckError("execute() called with nothing scheduled")
        self.batch_sizes.append(len(scheduled.sequences))
        self.num_batched_tokens.append(scheduled.num_batched_tokens)
        self.dropped_ids.extend(scheduled.finished_request_ids)
        self.history.append([(s.request_id, s.start_position, s.num_tokens, s.sample) for s in scheduled.sequences])
        token_ids: list[int] = []
        logprobs: list[float | None] = []
        for seq in scheduled.sequences:
            if self.check_kv:
                self._check_and_write(seq)
            if seq.sample:
                token_ids.append(self.token_fn(seq.request_id, len(seq.output_token_ids)))
                logprobs.append(-0.5 if seq.sampling.return_log_probs else None)
        wanted = any(lp is not None for lp in logprobs)
        return RunnerOutput(token_ids=token_ids, logprobs=logprobs if wanted else None,
                            model_seconds=self.model_seconds)

    def _slot(self, table: list[int], position: int) -> int:
        index = position // self.block_size
        if index >= len(table):
            raise KVCheckError(f"position {position} has no block (table has {len(table)})")
        block = table[index]
        if not 0 <= block < self.num_blocks:
            raise KVCheckError(f"block id {block} out of range")
        return block * self.block_size + position % self.block_size

    def _check_and_write(self, seq) -> None:
        history = seq.prompt_token_ids + seq.output_token_ids
        start, n = seq.start_position, seq.num_tokens
        if seq.token_ids != history[start:start + n]:
            raise KVCheckError(f"{seq.request_id}: fed tokens are not the history at {start}")
        if seq.sample != (start + n == len(history)):
            raise KVCheckError(f"{seq.request_id}: sample flag wrong")
        for p in range(start):
            if self.slots[self._slot(seq.block_table, p)] != history[p]:
                raise KVCheckError(f"{seq.request_id}: KV slot of position {p} does not hold its token")
        for i, token in enumerate(seq.token_ids):
            self.slots[self._slot(seq.block_table, start + i)] = token


class SlowFakeRunner(FakeRunner):
    """Sleeps in execute, for tests that need a step to take real time."""

    def __init__(self, *args: object, sleep_s: float = 0.01, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.sleep_s = sleep_s

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        time.sleep(self.sleep_s)
        return super().execute(scheduled)
