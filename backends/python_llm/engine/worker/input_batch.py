"""The runner's persistent batch (vLLM v1's InputBatch / CachedRequestState):
everything the runner holds per request between steps, kept up to date from
the scheduler's messages and from its own samples.

A request arrives whole once (`NewRequestData`); after that a step brings
only its new blocks and progress. The runner appends the tokens it samples
to its own copy of the request's tokens, so the next step's input, the
penalties, `min_tokens` and bad words all read runner-owned state and the
scheduler's objects are never shared. A preempted request loses its row (its
blocks are gone) and comes back as a new request; its RNG stays until the
request finishes, so a seeded request draws the same stream either way.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from ..core.sampling_params import SamplingParams
from ..core.scheduler_output import NewRequestData, SchedulerOutput
from .block_table_rows import BlockTableRows


class SchedulingError(ValueError):
    """A SchedulerOutput the runner cannot execute (a scheduler bug, not bad user input)."""


class CachedRequestState:
    __slots__ = (
        "request_id",
        "token_ids",
        "num_prompt_tokens",
        "sampling",
        "block_ids",
        "row",
        "num_computed_tokens",
        "generator",
        "greedy_after",
    )

    def __init__(
        self,
        request_id: str,
        token_ids: list[int],
        num_prompt_tokens: int,
        sampling: SamplingParams,
        block_ids: list[int],
        num_computed_tokens: int = 0,
        row: int = -1,
        generator: torch.Generator | None = None,
    ) -> None:
        self.request_id = request_id
        self.token_ids = token_ids  # prompt + output; the runner appends its samples
        self.num_prompt_tokens = num_prompt_tokens
        self.sampling = sampling
        self.block_ids = block_ids
        self.row = row  # of the BlockTableRows, -1: none
        self.num_computed_tokens = num_computed_tokens
        self.generator = generator
        # the runner asks at every step whether the next token is a plain
        # argmax (SamplingParams.plain_greedy_after); settings are frozen
        self.greedy_after = sampling.plain_greedy_after

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        """Generated so far, a continuation included (a copy)."""
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


class InputBatch:
    def __init__(self, max_blocks_per_seq: int, max_num_seqs: int, device: torch.device) -> None:
        self.device = device
        self.requests: dict[str, CachedRequestState] = {}
        self.block_rows = BlockTableRows(max_blocks_per_seq, max_num_seqs)
        # by request id, from the first admission to the finish
        self._generators: dict[str, torch.Generator] = {}

    def update(self, scheduled: SchedulerOutput) -> list[CachedRequestState]:
        """Apply a step's message; the scheduled requests' states in batch order."""
        self.remove(scheduled.preempted_req_ids)
        self.remove(scheduled.finished_req_ids)
        for request_id in scheduled.finished_req_ids:
            self._generators.pop(request_id, None)
        requests = self.requests
        cached = scheduled.scheduled_cached_reqs
        states: list[CachedRequestState] = []
        rows = self.block_rows
        for request_id, new_blocks, computed in zip(cached.req_ids, cached.new_block_ids, cached.num_computed_tokens):
            state = requests.get(request_id)
            if state is None:
                raise SchedulingError(f"request {request_id}: scheduled as known to the runner, which never saw it")
            if new_blocks is not None:
                rows.write(state.row, len(state.block_ids), new_blocks)
                state.block_ids.extend(new_blocks)
            state.num_computed_tokens = computed
            states.append(state)
        for new in scheduled.scheduled_new_reqs:
            states.append(self.add(new))
        return states

    def add(self, new: NewRequestData) -> CachedRequestState:
        if new.request_id in self.requests:
            raise SchedulingError(f"request {new.request_id}: sent as new, but the runner holds it")
        generator = self._generators.get(new.request_id)
        seed = new.sampling.seed
        if generator is None and seed is not None:
            generator = self._generators[new.request_id] = torch.Generator(self.device).manual_seed(seed)
        state = CachedRequestState(
            new.request_id,
            list(new.token_ids),
            new.num_prompt_tokens,
            new.sampling,
            list(new.block_ids),
            new.num_computed_tokens,
            self.block_rows.add(new.block_ids),
            generator,
        )
        self.requests[new.request_id] = state
        return state

    def remove(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            state = self.requests.pop(request_id, None)
            if state is not None:
                self.block_rows.free(state.row)

    @staticmethod
    def append_sampled(states: Sequence[CachedRequestState], token_ids: Sequence[int]) -> None:
        """The tokens sampled for `states` (in order), as the scheduler will
        append them to its Requests."""
        for state, token in zip(states, token_ids):
            state.token_ids.append(token)
