"""The one plain object the scheduler hands the runner each step (vLLM's
SchedulerOutput seam): the scheduler decides, the runner executes."""
from __future__ import annotations

from dataclasses import dataclass, field

from .sampling_params import SamplingParams


@dataclass(slots=True)
class ScheduledSequence:
    """One sequence's work in this step.

    `token_ids` are fed at positions start_position .. start_position+len-1;
    their K/V go to the slots given by `block_table` (block b holds positions
    b_index*block_size .. +block_size-1). The runner attends over positions
    0 .. start_position+len-1 (the cached prefix plus this chunk).
    When `sample` is true this chunk reaches the end of the known tokens and
    the runner samples the next token from its last position.
    `block_table` is the request's own table (the KV manager's list, passed
    by reference): while the request holds its blocks it only grows, so the
    runner may keep a copy keyed by this list's identity and append to it.
    A running request's decode entry is one object reused from step to step
    (its token and position updated in place), so a SchedulerOutput is valid
    until the next `schedule()` call: copy what must outlive the step.
    """
    request_id: str
    token_ids: list[int]
    start_position: int
    block_table: list[int]
    sample: bool
    sampling: SamplingParams
    # all tokens generated so far (penalties, min_tokens need them)
    output_token_ids: list[int] = field(default_factory=list)
    prompt_token_ids: list[int] = field(default_factory=list)
    # the request's private RNG seed state lives in the runner, keyed by id
    seed: int | None = None
    # sampling.plain_greedy_after, copied by the scheduler so that the
    # runner's per-step check reads this object only (None: not copied)
    greedy_after: int | None = None

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class SchedulerOutput:
    # decode sequences (one token each) first, then prefill chunks
    sequences: list[ScheduledSequence]
    num_batched_tokens: int
    # requests whose runner-side state (RNG) can be dropped
    finished_request_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.sequences


@dataclass
class RunnerOutput:
    """What the runner returns: one sampled token per `sample=True` sequence,
    in the order of SchedulerOutput.sequences (parallel lists, not an object
    per token: a step at 64 sequences is budgeted in microseconds)."""
    token_ids: list[int]
    # log p of each chosen token; None when no sequence of the step asked,
    # else None in the rows that did not
    logprobs: list[float | None] | None = None
    # seconds spent inside decoder layers + LM head (for overhead accounting)
    model_seconds: float = 0.0
