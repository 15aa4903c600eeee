"""A FakeRunner for engine tests: deterministic tokens, and a check of the
KV bookkeeping on every step.

It keeps one token id per KV slot. Each step it first checks that every slot
before the fed chunk (the cached prefix, or recomputed history) holds the
sequence's own token, then writes the chunk's tokens into their slots. A
block freed while still in use, a wrong prefix-cache hit or a bad block table
therefore raises KVCheckError, which kills the engine and fails the test.
Like the real runner it learns a request once and then only what changed
(`scheduler_output.py`), and appends the tokens it returns to its own copy.
With `num_layers` it runs layer slices too (`LayerSlice`), checking that each
slice continues its chunk where the last one ended.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.scheduler_output import RunnerOutput, SchedulerOutput
from python_llm.engine.worker.input_batch import CachedRequestState

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
    num_layers: int = 0
    attention_parity_context: float = 0.0  # unknown: every prefill token costs the same


class FakeRunner:
    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        token_fn: Callable[[str, int], int] = default_token,
        check_kv: bool = True,
        fail_at_step: int | None = None,
        max_model_len: int = 2048,
        model_seconds: float = 0.0,
        num_layers: int = 0,
    ) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.model_info = FakeModelInfo(max_model_len=max_model_len, num_layers=num_layers)
        self.runs_layer_slices = num_layers > 0
        self.slices: dict[str, tuple[int, int]] = {}  # request id -> (chunk tokens, layers run)
        self.slice_history: list[tuple[str, int, int, int]] = []  # (id, chunk tokens, first, end layer)
        self.token_fn = token_fn
        self.check_kv = check_kv
        self.fail_at_step = fail_at_step
        self.model_seconds = model_seconds
        self.slots: list[int | None] = [None] * (num_blocks * block_size)
        self.steps = 0
        self.batch_sizes: list[int] = []
        self.num_batched_tokens: list[int] = []
        self.dropped_ids: list[str] = []
        self.preempted_ids: list[str] = []
        self.requests: dict[str, CachedRequestState] = {}
        # what each sampled request showed the sampler: (prompt, output)
        self.seen: list[tuple[list[int], list[int]]] = []
        self.history: list[list[tuple[str, int, int, bool]]] = []  # per step: (id, start, n, sample)

    @classmethod
    def for_config(cls, config: EngineConfig, **kwargs: object) -> FakeRunner:
        return cls(config.num_cpu_blocks, config.block_size, **kwargs)  # type: ignore[arg-type]

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        self.steps += 1
        if self.fail_at_step is not None and self.steps >= self.fail_at_step:
            raise RuntimeError("fake runner failure")
        if scheduled.is_empty:
            raise KVCheckError("execute() called with nothing scheduled")
        self.batch_sizes.append(scheduled.num_scheduled_reqs)
        self.num_batched_tokens.append(scheduled.total_num_scheduled_tokens)
        self.dropped_ids.extend(scheduled.finished_req_ids)
        self.preempted_ids.extend(scheduled.preempted_req_ids)
        for rid in scheduled.preempted_req_ids + scheduled.finished_req_ids:
            self.requests.pop(rid, None)
            self.slices.pop(rid, None)
        batch = self._update(scheduled)
        unfinished = self._slice_in_flight(scheduled)
        history: list[tuple[str, int, int, bool]] = []
        token_ids: list[int] = []
        logprobs: list[float | None] = []
        for req, n in zip(batch, scheduled.num_scheduled_tokens):
            start = req.num_computed_tokens
            sample = start + n == len(req.token_ids) and req.request_id != unfinished
            history.append((req.request_id, start, n, sample))
            if self.check_kv:
                self._check_and_write(req, n)
            if sample:
                self.seen.append((req.prompt_token_ids, req.output_token_ids))
                token_ids.append(self.token_fn(req.request_id, len(req.output_token_ids)))
                logprobs.append(-0.5 if req.sampling.return_log_probs else None)
        for req, n in zip(batch, scheduled.num_scheduled_tokens):
            if req.request_id != unfinished:
                req.num_computed_tokens += n
        for req, token in zip([r for r in batch if r.num_computed_tokens == len(r.token_ids)], token_ids):
            req.token_ids.append(token)
        self.history.append(history)
        wanted = any(lp is not None for lp in logprobs)
        return RunnerOutput(
            token_ids=token_ids, logprobs=logprobs if wanted else None, model_seconds=self.model_seconds
        )

    def _slice_in_flight(self, scheduled: SchedulerOutput) -> str | None:
        """Check the step's layer slice against the chunk's last one; the
        request id when the chunk has layers left after it."""
        layer_slice = scheduled.layer_slice
        if layer_slice is None:
            return None
        rid = layer_slice.request_id
        if not self.model_info.num_layers:
            raise KVCheckError(f"{rid}: a layer slice for a runner without layers")
        ids = scheduled.req_ids()
        if rid not in ids:
            raise KVCheckError(f"{rid}: a layer slice of a request not in the step")
        tokens = scheduled.num_scheduled_tokens[ids.index(rid)]
        expected = self.slices.get(rid, (tokens, 0))
        if (tokens, layer_slice.first_layer) != expected or not (
            layer_slice.first_layer < layer_slice.end_layer <= self.model_info.num_layers
        ):
            raise KVCheckError(f"{rid}: slice {layer_slice} of {tokens} tokens after {expected}")
        self.slice_history.append((rid, tokens, layer_slice.first_layer, layer_slice.end_layer))
        if layer_slice.end_layer == self.model_info.num_layers:
            self.slices.pop(rid, None)
            return None
        self.slices[rid] = (tokens, layer_slice.end_layer)
        return rid

    def _update(self, scheduled: SchedulerOutput) -> list[CachedRequestState]:
        batch = []
        cached = scheduled.scheduled_cached_reqs
        for rid, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            if rid not in self.requests:
                raise KVCheckError(f"{rid}: sent as cached, never sent as new")
            req = self.requests[rid]
            if computed != req.num_computed_tokens:
                raise KVCheckError(f"{rid}: scheduled from {computed}, {req.num_computed_tokens} computed")
            req.block_ids.extend(new_blocks or ())
            batch.append(req)
        for new in scheduled.scheduled_new_reqs:
            if new.request_id in self.requests:
                raise KVCheckError(f"{new.request_id}: sent as new, already held")
            req = self.requests[new.request_id] = CachedRequestState(
                new.request_id,
                list(new.token_ids),
                new.num_prompt_tokens,
                new.sampling,
                list(new.block_ids),
                new.num_computed_tokens,
            )  # the real runner's state, without its block-table row
            batch.append(req)
        return batch

    def _slot(self, table: list[int], position: int) -> int:
        index = position // self.block_size
        if index >= len(table):
            raise KVCheckError(f"position {position} has no block (table has {len(table)})")
        block = table[index]
        if not 0 <= block < self.num_blocks:
            raise KVCheckError(f"block id {block} out of range")
        return block * self.block_size + position % self.block_size

    def _check_and_write(self, req: CachedRequestState, n: int) -> None:
        history = req.token_ids
        start = req.num_computed_tokens
        if start + n > len(history):
            raise KVCheckError(f"{req.request_id}: tokens up to {start + n} scheduled, {len(history)} known")
        for p in range(start):
            if self.slots[self._slot(req.block_ids, p)] != history[p]:
                raise KVCheckError(f"{req.request_id}: KV slot of position {p} does not hold its token")
        for i, token in enumerate(history[start : start + n]):
            self.slots[self._slot(req.block_ids, start + i)] = token


class SlowFakeRunner(FakeRunner):
    """Sleeps in execute, for tests that need a step to take real time."""

    def __init__(self, *args: object, sleep_s: float = 0.01, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.sleep_s = sleep_s

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        time.sleep(self.sleep_s)
        return super().execute(scheduled)
