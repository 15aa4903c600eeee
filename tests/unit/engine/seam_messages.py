"""Scheduler → runner messages built by hand, for runner and sampler tests
(the scheduler builds them in the engine). Their requests are greedy
unless `params` set a temperature."""

from __future__ import annotations

from collections.abc import Sequence

from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from python_llm.engine.worker.input_batch import CachedRequestState


def new_request(
    request_id: str,
    token_ids: Sequence[int],
    block_ids: Sequence[int],
    computed: int = 0,
    num_prompt_tokens: int | None = None,
    sampling: SamplingParams | None = None,
    **params,
) -> NewRequestData:
    return NewRequestData(
        request_id,
        tuple(token_ids),
        len(token_ids) if num_prompt_tokens is None else num_prompt_tokens,
        sampling or SamplingParams(**{"temperature": 0.0, **params}),
        tuple(block_ids),
        computed,
    )


def step(
    new: Sequence[tuple[NewRequestData, int]] = (),
    cached: Sequence[tuple[str, int, int, Sequence[int] | None]] = (),
    finished: Sequence[str] = (),
    preempted: Sequence[str] = (),
) -> SchedulerOutput:
    """`new`: (request, tokens scheduled); `cached`: (request id, num computed,
    tokens scheduled, new block ids or None). Batch order: cached, then new."""
    data = CachedRequestData(
        [c[0] for c in cached], [None if c[3] is None else tuple(c[3]) for c in cached], [c[1] for c in cached]
    )
    num_scheduled = [c[2] for c in cached] + [n for _, n in new]
    return SchedulerOutput(
        [r for r, _ in new], data, num_scheduled, sum(num_scheduled), list(finished), list(preempted)
    )


def prefill(
    request_id: str, token_ids: Sequence[int], block_ids: Sequence[int], num_tokens: int | None = None, **params
) -> SchedulerOutput:
    """One new request, its first `num_tokens` (all by default) scheduled."""
    request = new_request(request_id, token_ids, block_ids, **params)
    return step(new=[(request, len(token_ids) if num_tokens is None else num_tokens)])


def state(
    request_id: str,
    token_ids: Sequence[int],
    block_ids: Sequence[int],
    computed: int = 0,
    num_prompt_tokens: int | None = None,
    row: int = -1,
    **params,
) -> CachedRequestState:
    """A runner-side request state, for calling the runner's or sampler's parts directly."""
    return CachedRequestState(
        request_id,
        list(token_ids),
        len(token_ids) if num_prompt_tokens is None else num_prompt_tokens,
        SamplingParams(**{"temperature": 0.0, **params}),
        list(block_ids),
        computed,
        row,
    )
