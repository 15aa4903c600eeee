"""Greedy decoding's LM head in int16, exact by a bound.

Where the CPU has no bf16 dot products (AVX2: Zen 3, older Intel), the fp32
LM head runs at the FMA peak and is a sixth of a 64-row decode step on the
default model. The native kernel (`kernels/int16_lm_head.cpp`, where its
bound is derived) multiplies 12-bit hidden rows by 11-bit weight rows in
int16 lanes (vpmaddwd: twice fp32's multiplies a cycle, half its bytes) and
keeps the candidates whose error bound reaches the best lower end; they are
dotted again in fp64 from the fp32 rows, so the token is the exact argmax,
as the bf16 head's (greedy_head.py). SmolLM2-135M on a 2-core Zen 3: 14.4
against 23.2 ms at 64 rows, 1.8 against 3.2 ms at one row
(`python -m bench.lm_head_probe`); ~1.5 candidates a row. Sampled rows and
log-probs keep fp32 logits.
"""

from __future__ import annotations

import torch

from ..kernels import CpuKernels


class Int16GreedyHead:
    """The argmax of hidden @ weight.T per row from the weight's int16 copy
    and the fp32 one (the candidates' rows)."""

    __slots__ = ("weight", "packed", "kernels", "_scratch")

    def __init__(self, weight: torch.Tensor, kernels: CpuKernels) -> None:
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError("Int16GreedyHead: an fp32 [vocab, dim] weight expected")
        self.weight = weight.detach().contiguous()  # the model's own (the embedding, when tied)
        self.packed = kernels.int16_pack_lm_head(self.weight)
        self.kernels = kernels
        # the approximate logits; kept at the largest step's rows, as a fresh
        # 12 MB buffer a step costs its page faults each time
        self._scratch = torch.empty(0)

    def __call__(self, normed: torch.Tensor) -> tuple[list[int], list[int]]:
        """(token per row, -1 where the row is not finite; candidates per row)"""
        needed = normed.shape[0] * self.packed.scales.shape[0]
        if self._scratch.numel() < needed:
            self._scratch = torch.empty(needed)
        return self.kernels.int16_lm_head_argmax(normed.contiguous(), self.packed, self._scratch)
