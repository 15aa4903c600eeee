"""Per-request generation settings.

`validate()` holds every rule that depends on the settings alone; the engine
calls it once, at intake, and adds only what depends on the engine (its
`max_tokens_limit`, the model's length and vocabulary, the KV cache). Parsers
in front of the engine (`request_inputs.py`) only convert."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from contract.errors import format_refusal
from contract.public_bounds import bound_problem

# the settings whose value rules are the public inputs' of the same name
_BOUNDED = (
    "max_tokens",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "min_tokens",
    "token_timeout_ms",
    "seed",
)


class InvalidRequestError(ValueError):
    """Bad input from a client. The message is the contract's refusal form
    (contract.errors): '<field>: <what>', or '<field> (<internal>): <what>'
    when the step knows the public input `field` by another name."""

    def __init__(self, field: str, problem: str, internal: str | None = None) -> None:
        self.field = field
        self.problem = problem
        super().__init__(format_refusal(field, problem, internal))


@dataclass(frozen=True)
class SamplingParams:
    """Frozen: the scheduler hands the same object to the runner (see
    scheduler_output.py), so nobody may change it after intake; the engine
    fills in its defaults with `dataclasses.replace`."""

    max_tokens: int | None = None  # None = the engine's default_max_tokens (filled in at intake)
    # 1.0 = the model's own distribution when unset, as OpenAI, vLLM and
    # TensorRT-LLM default it (and the public inputs); 0 = greedy
    temperature: float = 1.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0
    repetition_penalty: float = 1.0  # HF semantics (divide positive logits)
    presence_penalty: float = 0.0  # OpenAI semantics
    frequency_penalty: float = 0.0
    min_tokens: int = 0
    seed: int | None = None  # None = nondeterministic
    ignore_eos: bool = False
    # None = the model's EOS ids (filled in by the engine); [] = no stop token
    stop_token_ids: list[int] | None = None
    stop_words_ids: list[list[int]] = field(default_factory=list)  # token-level stop sequences
    bad_words_ids: list[list[int]] = field(default_factory=list)
    return_log_probs: bool = False
    token_timeout_ms: int | None = None  # None = engine default; 0 = off
    # hooks for guided decoding etc.: fn(output_token_ids, logits[vocab]) -> logits,
    # applied by the sampler before penalties (see worker/sampler.py)
    logits_processors: list[Callable[[list[int], Any], Any]] = field(default_factory=list)

    def validate(self) -> None:
        """Raise InvalidRequestError naming the first field that breaks a rule."""
        # the value rules are the public inputs' (contract/public_bounds.py), so the
        # gateway and the client library refuse exactly what the engine would
        for name in _BOUNDED:
            problem = bound_problem(name, getattr(self, name))
            if problem is not None:
                raise InvalidRequestError(name, problem)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @cached_property
    def rewrites_logits(self) -> bool:
        """Whether the sampler changes the logits whatever the progress
        (processors, penalties, bad words); the `min_tokens` ban depends on
        progress and is not included. Computed once: settings do not change
        after intake."""
        return bool(
            self.logits_processors
            or self.repetition_penalty != 1.0
            or self.presence_penalty != 0.0
            or self.frequency_penalty != 0.0
            or self.bad_words_ids
        )

    @cached_property
    def plain_greedy_after(self) -> int:
        """From how many generated tokens on the next token is a plain argmax
        of the raw logits (greedy, no log-probabilities, nothing that rewrites
        the logits: processors, penalties, bad words, the stop-token ban of
        `min_tokens`); -1: never. Computed once per request: settings do not
        change after intake, and the runner asks for every sequence at every
        step."""
        if self.temperature != 0.0 or self.return_log_probs or self.rewrites_logits:
            return -1
        return self.min_tokens if self.stop_token_ids else 0
