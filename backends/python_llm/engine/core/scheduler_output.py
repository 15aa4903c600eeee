"""The messages between the scheduler and the runner (vLLM v1's seam).

The scheduler decides, the runner executes, and neither reads or writes the
other's objects. A request reaches the runner once, whole (`NewRequestData`);
after that each step sends only what changed (`CachedRequestData`: blocks
added, progress). The runner keeps its own copy of each request's tokens and
appends the tokens it samples, so a steady decode step costs the scheduler a
few appends per sequence and no object. Every field is a copy or immutable:
the scheduler may change its Requests and block tables as soon as
`schedule()` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .sampling_params import SamplingParams


@dataclass(frozen=True, slots=True)
class NewRequestData:
    """A request the runner does not hold: first admission, or re-admission
    after preemption (then `token_ids` include the output so far, and the
    runner keeps the request's RNG, which only a finish drops)."""

    request_id: str
    # prompt, then output already generated (a continuation, or this
    # request's own tokens before it was preempted)
    token_ids: tuple[int, ...]
    num_prompt_tokens: int
    sampling: SamplingParams
    block_ids: tuple[int, ...]
    # tokens whose K/V are already in `block_ids` (prefix-cache hits)
    num_computed_tokens: int


@dataclass(slots=True)
class CachedRequestData:
    """Parallel lists, one entry per scheduled request the runner holds."""

    req_ids: list[str] = field(default_factory=list)
    # blocks appended to the request's table for this step, None for none
    new_block_ids: list[tuple[int, ...] | None] = field(default_factory=list)
    # the position of the first token this step feeds
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class LayerSlice:
    """A prompt chunk that runs only decoder layers [first_layer, end_layer)
    this step (`prefill_pacer.py`: a long prompt under pacing advances by
    layers of a big chunk rather than by small chunks through all layers).
    The request's entry in the step carries the whole chunk's tokens from
    its `num_computed_tokens`, the same at every slice; the runner keeps the
    chunk's hidden states from one slice to the next, and samples it only
    after the slice that ends at the last layer."""

    request_id: str
    first_layer: int
    end_layer: int


@dataclass(slots=True)
class SchedulerOutput:
    """One step's work.

    Batch order: the cached requests in their order (decodes first, then
    chunks of running prefills), then the new ones; `num_scheduled_tokens` is
    parallel to it. A request feeds its tokens from `num_computed_tokens` on
    and is sampled when that reaches the end of its tokens.
    """

    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: list[int]
    total_num_scheduled_tokens: int
    # finished since the last step sent: the runner drops all it holds for them
    finished_req_ids: list[str] = field(default_factory=list)
    # preempted since the last step sent: the runner drops their batch rows
    # (their blocks are gone) and keeps their RNG for the re-admission
    preempted_req_ids: list[str] = field(default_factory=list)
    # at most one chunk a step runs only some of the layers
    layer_slice: LayerSlice | None = None

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens

    @property
    def num_scheduled_reqs(self) -> int:
        return len(self.num_scheduled_tokens)

    def req_ids(self) -> list[str]:
        """The scheduled request ids in batch order (built on each call)."""
        return self.scheduled_cached_reqs.req_ids + [new.request_id for new in self.scheduled_new_reqs]

    def chunks(self) -> list[tuple[str, int, int]]:
        """(request id, first position, tokens) in batch order, built on each
        call: for probes and tests, not for the step's hot path."""
        starts = self.scheduled_cached_reqs.num_computed_tokens + [
            new.num_computed_tokens for new in self.scheduled_new_reqs
        ]
        return list(zip(self.req_ids(), starts, self.num_scheduled_tokens))


@dataclass
class RunnerOutput:
    """What the runner returns: one sampled token per request whose chunk
    reached the end of its tokens, in batch order (parallel lists, not an
    object per token: a step at 64 sequences is budgeted in microseconds)."""

    token_ids: list[int]
    # log p of each chosen token; None when no sequence of the step asked,
    # else None in the rows that did not
    logprobs: list[float | None] | None = None
    # seconds spent inside decoder layers + LM head (for overhead accounting)
    model_seconds: float = 0.0
    # a LayerSlice step: the slice's own share of the step's seconds (None:
    # not measured, e.g. a slice of every layer)
    slice_seconds: float | None = None
