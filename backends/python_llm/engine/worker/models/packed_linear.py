"""A decoder layer's projections, two ways behind one interface:
`TorchLinear` (`F.linear`, the reference) and, for fp32 on the CPU,
`PackedLinear` (oneDNN with weights packed once).

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


Linear = TorchLinear | PackedLinear


@dataclass(frozen=True)
class LayerProjections:
    """A layer's four projections, all of one kind."""
    qkv: Linear
    o: Linear
    gate_up: Linear
    down: Linear

    @property
    def packed(self) -> bool:
        return isinstance(self.qkv, PackedLinear)
