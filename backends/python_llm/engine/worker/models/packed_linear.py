"""A decoder layer's projections, three ways behind one interface:
`TorchLinear` (`F.linear`, the reference); for fp32 on the CPU,
`PackedLinear` (oneDNN with weights packed once); and where the CPU has
AMX-BF16, `AmxLinear` (kernels/amx_gemm.cpp: fp32 by three-way bf16
splitting on AMX tiles, oneDNN below AMX_MIN_ROWS rows).

Why oneDNN: on the CPU `F.linear` calls MKL's sgemm, which re-packs the
weight on every call; oneDNN takes the weight already in its blocked layout
(`mkldnn._reorder_linear_weight`, done at load) and runs an epilogue on the
output while it is still in cache. Measured on the 2-core AVX2 machines
(SmolLM2-135M's four projections, 30 layers of distinct weights, fp32):
64 rows 193 → 132 ms, 128 rows 260 → 227 ms, 512 rows about equal.
It is also what vLLM's CPU build does (`dispatch_cpu_unquantized_gemm`).

The one epilogue used is `add` (a residual): the result equals the unfused
ops up to fp32 rounding of the GEMM's summation order, as MKL's does.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels import CpuKernels

_linear = torch.ops.mkldnn._linear_pointwise
_reorder = torch.ops.mkldnn._reorder_linear_weight


def packed_linears_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packs fp32 on the CPU here; bf16/fp16 would need AVX-512 or AMX
    to be worth it, and CUDA has its own GEMMs."""
    return device.type == "cpu" and dtype == torch.float32 and torch.backends.mkldnn.is_available()


class TorchLinear:
    """y = F.linear(x, weight, bias), reading the layer's parameters."""

    __slots__ = ("weight", "bias")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = weight, bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W.T + b) + other"""
        return F.linear(x, self.weight, self.bias) + other


class PackedLinear:
    """y = x @ weight.T + bias, with the weight in oneDNN's layout."""

    __slots__ = ("weight", "bias")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight = _reorder(weight.detach().contiguous(), None)
        self.bias = None if bias is None else bias.detach().contiguous()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return _linear(x, self.weight, self.bias, "none", [], "")

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W.T + b) + other, the add fused as oneDNN's epilogue"""
        return _linear(x, other, self.weight, self.bias, "add")


# Below this many rows the AMX GEMM only streams its 1.5x larger weights
# (a memory-bound step), so oneDNN's fp32 copy runs instead. Measured on the
# 2-core AMX machines, SmolLM2-135M's four projections x 30 layers:
# 16 rows 34 (AMX) vs 28 ms (oneDNN), 32 rows 34 vs 38, 64 rows 50 vs 62.
AMX_MIN_ROWS = 24


class AmxLinear:
    """y = x @ weight.T + bias on AMX tiles, fp32 accuracy (the weight split
    into three bf16 parts, kernels/amx_gemm.cpp), with oneDNN's packed fp32
    weight for steps of few rows: both copies are kept (2.5x the fp32 bytes)."""

    __slots__ = ("parts", "bias", "n", "k", "kernels", "few_rows")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels: CpuKernels) -> None:
        weight = weight.detach().contiguous()
        self.parts = kernels.amx_pack_weight(weight)
        self.bias = None if bias is None else bias.detach().contiguous()
        self.n, self.k = weight.shape
        self.kernels = kernels
        self.few_rows = PackedLinear(weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < AMX_MIN_ROWS:
            return self.few_rows(x)
        return self.kernels.amx_linear(x, self.parts, self.n, self.k, self.bias)

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W.T + b) + other, the add done as the tiles are stored"""
        if x.shape[0] < AMX_MIN_ROWS:
            return self.few_rows.plus(x, other)
        return self.kernels.amx_linear(x, self.parts, self.n, self.k, self.bias, other)


Linear = TorchLinear | PackedLinear | AmxLinear


@dataclass(frozen=True)
class LayerProjections:
    """A layer's four projections, all of one kind."""
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear

    @property
    def packed(self) -> bool:
        return not isinstance(self.qkv, TorchLinear)
