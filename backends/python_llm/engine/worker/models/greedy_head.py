"""Greedy decoding's LM head in bf16, exact by a bound.

Where the CPU has bf16 dot products (AVX512-BF16, AMX-BF16), oneDNN runs
the LM head in bf16 at half fp32's time or less (SmolLM2-135M's 49k x 576 on
a 2-core Zen 4: 9.3 vs 17.6 ms at 57 rows, 2.3 vs 4.5 ms at one row). The
bf16 logits are approximate, so they only pick the candidates: every logit
whose error bound reaches the largest lower end. The native kernel
(`kernels/verified_argmax.cpp`) dots the candidates again in fp64 from the
fp32 rows, so the token is the exact argmax, as the fp32 path's is up to
fp32 rounding. Sampled (non-greedy) rows and log-probs keep fp32 logits.

The bound, for one logit over `dim` terms: the hidden row and the weight row
rounded to bf16 (relative error u = 2^-8 each), products exact in fp32, an
fp32 sum (any order, gamma_dim = dim u32 / (1 - dim u32)), the result
rounded to bf16 (u). So |approx - exact| <= (3u + 3u^2 + gamma_dim (1+u)^3)
sum_i |h_i w_i|, and by Cauchy-Schwarz the sum is at most ||h|| ||w||.
"""

from __future__ import annotations

import torch

from ..kernels import CpuKernels
from .int16_greedy_head import Int16GreedyHead
from .packed_linear import PackedLinear, mkldnn_available

BF16_UNIT_ROUNDOFF = 2.0**-8
FP32_UNIT_ROUNDOFF = 2.0**-24
# covers the kernel's own fp32 arithmetic on the bounds (the margin, the two
# ends) and the row norms stored in fp32
_SLACK = 8 * FP32_UNIT_ROUNDOFF


def bf16_logit_bound(dim: int) -> float:
    """The factor of ||h|| ||w_v|| that bounds a bf16 logit's error."""
    u, u32 = BF16_UNIT_ROUNDOFF, FP32_UNIT_ROUNDOFF
    gamma = dim * u32 / (1.0 - dim * u32)
    return 3 * u + 3 * u * u + gamma * (1 + u) ** 3 + _SLACK


def onednn_bf16_gemm() -> bool:
    """Whether oneDNN runs bf16 GEMMs on this CPU: natively, or emulated on
    AVX-512 without bf16 instructions; it refuses them on AVX2 and older."""
    return mkldnn_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


class Bf16RoundedLinear:
    """x @ weight.T in fp32 on bf16-rounded inputs and weights, rounded to
    bf16: the arithmetic the bound assumes, where oneDNN has no bf16 GEMM.
    `auto` never takes the verified head there (no bf16 dot products); the
    tests and `use_verified_greedy` may."""

    __slots__ = ("weight",)

    def __init__(self, weight: torch.Tensor) -> None:
        self.weight = weight.to(torch.bfloat16).float()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return (x.float() @ self.weight.t()).to(torch.bfloat16)


def _bf16_gemm(weight: torch.Tensor) -> PackedLinear | Bf16RoundedLinear:
    if onednn_bf16_gemm():
        try:  # a CPU torch's check passes may still be one oneDNN refuses when it runs
            packed = PackedLinear(weight.to(torch.bfloat16), None)
            packed(weight.new_zeros(1, weight.shape[1], dtype=torch.bfloat16))
            return packed
        except RuntimeError:
            pass
    return Bf16RoundedLinear(weight)


class VerifiedGreedyHead:
    """The argmax of hidden @ weight.T per row from a bf16 copy of the
    weight (oneDNN-packed) and the fp32 one (the candidates' rows)."""

    __slots__ = ("weight", "packed", "norms", "bound", "kernels")

    def __init__(self, weight: torch.Tensor, kernels: CpuKernels) -> None:
        if weight.dtype != torch.float32 or weight.dim() != 2:
            raise ValueError("VerifiedGreedyHead: an fp32 [vocab, dim] weight expected")
        self.weight = weight.detach().contiguous()  # the model's own (the embedding, when tied)
        self.packed = _bf16_gemm(self.weight)
        self.norms = self.weight.double().norm(dim=1).float()
        if not bool(torch.isfinite(self.norms).all()):
            raise ValueError("VerifiedGreedyHead: the LM head has non-finite weights")
        self.bound = bf16_logit_bound(self.weight.shape[1])
        self.kernels = kernels

    def __call__(self, normed: torch.Tensor) -> tuple[list[int], list[int]]:
        """(token per row, -1 where the row is not finite; candidates per row)"""
        approx = self.packed(normed.to(torch.bfloat16))
        return self.kernels.verified_argmax(approx, normed, self.weight, self.norms, self.bound)


GreedyHeads: dict[str, type[VerifiedGreedyHead] | type[Int16GreedyHead]] = {
    "bf16": VerifiedGreedyHead,
    "int16": Int16GreedyHead,
}


def verified_greedy_precision(kernels: CpuKernels | None, device: torch.device, dtype: torch.dtype) -> str | None:
    """The verified head `auto` takes for fp32 CPU models with the native
    kernels: bf16 where the CPU has bf16 dot products, else int16 where the
    kernels multiply int16 on AVX2 lanes and the fp32 head runs on the same
    8-float lanes (measured 1.6x there; an AVX-512 build's fp32 head on zmm
    against int16 on ymm is unmeasured, so it keeps fp32); None keeps the
    fp32 head."""
    if kernels is None or device.type != "cpu" or dtype != torch.float32:
        return None
    if mkldnn_available() and kernels.bf16_dot_supported():
        return "bf16"
    fp32_on_ymm = kernels.fma_gemm_supported() and kernels.fma_vector_floats() == 8
    return "int16" if kernels.int16_lm_head_supported() and fp32_on_ymm else None
