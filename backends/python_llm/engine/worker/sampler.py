"""Logits → next tokens for one step, batched over sequences.

Order (as vLLM / HF apply them): per-request logits processors, repetition
penalty (HF: over prompt + output), presence / frequency penalties (OpenAI:
over output), bans (stop tokens before `min_tokens`, `bad_words_ids`), then
greedy argmax, or temperature → top-k → top-p → a draw. "Output" includes a
continuation (ids another replica generated before this request took over):
penalties and the `min_tokens` ban see it as generated text. Draws use the
exponential race (argmax p/q, q ~ Exp(1)), which equals sampling from p, so a
seeded request can draw its noise from its own `torch.Generator`: its tokens
do not depend on which other requests share the batch.
The sampler reads the runner's own request states (`input_batch.py`): their
tokens, settings and generators.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from ..core.sampling_params import SamplingParams
from .input_batch import CachedRequestState
from .kernels import CpuKernels


@dataclass
class SamplerResult:
    token_ids: list[int]
    logprobs: list[float | None]


def _needs_processing(params: SamplingParams, num_generated: int) -> bool:
    return params.rewrites_logits or bool(num_generated < params.min_tokens and params.stop_token_ids)


def _banned_tokens(seq: CachedRequestState) -> list[int]:
    """Tokens this sequence may not produce next."""
    params = seq.sampling
    banned: list[int] = []
    if params.stop_token_ids and seq.num_output_tokens < params.min_tokens:
        banned.extend(params.stop_token_ids)
    for word in params.bad_words_ids:
        if not word:
            continue
        prefix = word[:-1]
        if not prefix:
            banned.append(word[-1])
            continue
        # the match may reach back into the prompt
        if seq.token_ids[-len(prefix) :] == prefix:
            banned.append(word[-1])
    return banned


class Sampler:
    def __init__(self, device: torch.device | str, kernels: CpuKernels | None = None) -> None:
        self.device = torch.device(device)
        # torch's CPU argmax is a scalar loop (~4 ms over 64 x 49k logits);
        # the native one is a vectorized single pass
        self.kernels = kernels if self.device.type == "cpu" else None

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        if self.kernels is not None and logits.dtype == torch.float32 and logits.stride(1) == 1:
            return self.kernels.argmax_rows(logits)
        return logits.argmax(dim=-1)

    @staticmethod
    def plain_greedy_row(seq: CachedRequestState) -> bool:
        """True when the sequence just takes the argmax of its raw logits now
        (greedy, no logits processing, no log-probabilities): the fast path,
        which the runner gives the model's greedy LM head."""
        after = seq.greedy_after
        return after == 0 or (after > 0 and len(seq.token_ids) - seq.num_prompt_tokens >= after)

    @staticmethod
    def plain_greedy(seqs: Sequence[CachedRequestState]) -> bool:
        return all(map(Sampler.plain_greedy_row, seqs))

    def __call__(self, logits: torch.Tensor, seqs: Sequence[CachedRequestState]) -> SamplerResult:
        """`logits` [len(seqs), vocab] fp32, one row per sampled sequence (it is
        modified in place). A seeded sequence draws from its own generator."""
        if logits.shape[0] != len(seqs):
            raise ValueError(f"logits rows ({logits.shape[0]}) != sequences ({len(seqs)})")
        if self.plain_greedy(seqs):
            return SamplerResult(self.argmax(logits).tolist(), [None] * len(seqs))
        params = [s.sampling for s in seqs]
        want_logprobs = [p.return_log_probs for p in params]

        processed = [_needs_processing(p, s.num_output_tokens) for p, s in zip(params, seqs)]
        if any(processed):
            self._process(logits, seqs, processed)
        tokens = self.argmax(logits)
        sample_rows = [i for i, p in enumerate(params) if not p.greedy]
        if sample_rows:
            rows = torch.tensor(sample_rows, device=self.device)
            scaled = self._filter(logits[rows], [params[i] for i in sample_rows])
            drawn = self._draw(scaled, [seqs[i].generator for i in sample_rows])
            tokens[rows] = drawn
            logits[rows] = scaled  # log-probs come from what was sampled from
        return SamplerResult(tokens.tolist(), self._logprobs(logits, tokens, want_logprobs))

    # --- processing -------------------------------------------------------
    def _process(self, logits: torch.Tensor, seqs: Sequence[CachedRequestState], processed: list[bool]) -> None:
        rep_rows: list[int] = []
        rep_tokens: list[int] = []
        rep_values: list[float] = []
        count_rows: list[int] = []
        count_tokens: list[int] = []
        presence = torch.zeros(len(seqs), 1, device=self.device)
        frequency = torch.zeros(len(seqs), 1, device=self.device)
        ban_rows: list[int] = []
        ban_tokens: list[int] = []
        for row, (seq, todo) in enumerate(zip(seqs, processed)):
            if not todo:
                continue
            p = seq.sampling
            output = seq.output_token_ids
            for processor in p.logits_processors:
                logits[row] = processor(output, logits[row])
            if p.repetition_penalty != 1.0:
                seen = set(seq.token_ids)
                rep_rows.extend([row] * len(seen))
                rep_tokens.extend(seen)
                rep_values.extend([p.repetition_penalty] * len(seen))
            if (p.presence_penalty or p.frequency_penalty) and output:
                count_rows.extend([row] * len(output))
                count_tokens.extend(output)
                presence[row] = p.presence_penalty
                frequency[row] = p.frequency_penalty
            banned = _banned_tokens(seq)
            ban_rows.extend([row] * len(banned))
            ban_tokens.extend(banned)

        if rep_rows:
            index = (torch.tensor(rep_rows, device=self.device), torch.tensor(rep_tokens, device=self.device))
            penalty = torch.tensor(rep_values, device=self.device)
            picked = logits[index]
            logits[index] = torch.where(picked > 0, picked / penalty, picked * penalty)
        if count_rows:
            counts = torch.zeros_like(logits)
            index = (torch.tensor(count_rows, device=self.device), torch.tensor(count_tokens, device=self.device))
            counts.index_put_(index, torch.ones(len(count_rows), device=self.device), accumulate=True)
            logits -= frequency * counts + presence * (counts > 0)
        if ban_rows:
            index = (torch.tensor(ban_rows, device=self.device), torch.tensor(ban_tokens, device=self.device))
            logits[index] = -torch.inf

    def _filter(self, logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
        """Temperature, then top-k, then top-p, on the rows that sample."""
        vocab = logits.shape[-1]
        temperature = torch.tensor([p.temperature for p in params], device=self.device).unsqueeze(1)
        logits = logits / temperature
        top_k = [p.top_k if 0 < p.top_k < vocab else 0 for p in params]
        top_p = [p.top_p for p in params]
        if all(p >= 1.0 for p in top_p):
            if any(top_k):
                k_max = max(top_k)
                kth = logits.topk(k_max, dim=-1).values
                k_index = torch.tensor([(k or k_max) - 1 for k in top_k], device=self.device).unsqueeze(1)
                threshold = kth.gather(1, k_index)
                threshold[torch.tensor([k == 0 for k in top_k], device=self.device)] = -torch.inf
                logits = logits.masked_fill(logits < threshold, -torch.inf)
            return logits
        ordered, order = logits.sort(dim=-1, descending=True)
        rank = torch.arange(vocab, device=self.device).unsqueeze(0)
        k = torch.tensor([k or vocab for k in top_k], device=self.device).unsqueeze(1)
        drop = rank >= k
        probs = ordered.masked_fill(drop, -torch.inf).softmax(dim=-1)
        # drop a token when the more likely ones already cover top_p; the top one always stays
        before = probs.cumsum(dim=-1) - probs
        drop |= before > torch.tensor(top_p, device=self.device).unsqueeze(1)
        ordered = ordered.masked_fill(drop, -torch.inf)
        return torch.empty_like(logits).scatter_(1, order, ordered)

    def _draw(self, logits: torch.Tensor, seeded: list[torch.Generator | None]) -> torch.Tensor:
        probs = logits.softmax(dim=-1)
        noise = torch.empty_like(probs)
        if not any(g is not None for g in seeded):
            noise.exponential_()
        else:
            for row, generator in enumerate(seeded):
                noise[row].exponential_(generator=generator)
        return self.argmax(probs / noise)

    @staticmethod
    def _logprobs(logits: torch.Tensor, tokens: torch.Tensor, wanted: list[bool]) -> list[float | None]:
        if not any(wanted):
            return [None] * len(wanted)
        rows = [i for i, w in enumerate(wanted) if w]
        index = torch.tensor(rows, device=logits.device)
        picked = logits[index].log_softmax(dim=-1).gather(1, tokens[index].unsqueeze(1)).squeeze(1).tolist()
        result: list[float | None] = [None] * len(wanted)
        for row, value in zip(rows, picked):
            result[row] = value
        return result
