"""A decoder layer's projections, four ways behind one interface:
`TorchLinear` (`F.linear`, the reference); for fp32 on the CPU,
`PackedLinear` (oneDNN with weights packed once); where the CPU has
AMX-BF16, `AmxLinear` (kernels/amx_gemm.cpp: fp32 by three-way bf16
splitting on AMX tiles; below AMX_MIN_ROWS rows the FMA GEMM); and where the
kernels build the FMA GEMM (AVX2 or AVX-512), `FmaLinear`
(kernels/fma_gemm.cpp: fp32 on FMA lanes; on AVX-512, oneDNN from
FMA_MAX_ROWS rows).

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

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ..kernels import CpuKernels

_linear = torch.ops.mkldnn._linear_pointwise
_reorder = torch.ops.mkldnn._reorder_linear_weight
# typed here: torch leaves it unannotated, and a call to it would be untyped
mkldnn_available: Callable[[], bool] = torch.backends.mkldnn.is_available


def packed_linears_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packs fp32 on the CPU here; bf16/fp16 would need AVX-512 or AMX
    to be worth it, and CUDA has its own GEMMs."""
    return device.type == "cpu" and dtype == torch.float32 and mkldnn_available()


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
        out: torch.Tensor = _linear(x, self.weight, self.bias, "none", [], "")
        return out

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W.T + b) + other, the add fused as oneDNN's epilogue"""
        out: torch.Tensor = _linear(x, other, self.weight, self.bias, "add")
        return out


# Below this many rows an fp32 copy runs instead of the AMX tiles: the FMA
# GEMM's, which reads few rows' weights as one stream (up to 96 rows, one
# pass of its row blocks) while the tiles stream their 1.5x larger weights.
# Measured on the 2-core AMX machines (`python -m bench.projection_probe`:
# SmolLM2-135M's four projections x 30 layers, distinct weights), ms:
#   rows    1     8     16    24    32    48    64    80    96
#   AMX     33.9  34.4  34.4  34.6  35.0  49.4  54.2  64.7  64.5
#   FMA     18.3  20.9  23.4  27.2  30.3  40.4  49.1  57.1  67.5
#   oneDNN  21.9  26.4  31.8  37.0  41.7  56.9  69.4  76.2  85.3
AMX_MIN_ROWS = 96


class AmxLinear:
    """y = x @ weight.T + bias on AMX tiles, fp32 accuracy (the weight split
    into three bf16 parts, kernels/amx_gemm.cpp), with the FMA GEMM's fp32
    copy for steps of fewer than AMX_MIN_ROWS rows: 2.5x the fp32 bytes."""

    __slots__ = ("parts", "bias", "n", "k", "kernels", "few_rows")

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernels: CpuKernels) -> None:
        weight = weight.detach().contiguous()
        self.parts = kernels.amx_pack_weight(weight)
        self.bias = None if bias is None else bias.detach().contiguous()
        self.n, self.k = weight.shape
        self.kernels = kernels
        # every AMX CPU has AVX-512, so a kernels build with AMX has the FMA GEMM
        self.few_rows = FmaLinear(weight, bias, kernels, few_rows_only=True)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] < AMX_MIN_ROWS:
            return self.few_rows(x)
        return self.kernels.amx_linear(x, self.parts, self.n, self.k, self.bias)

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W.T + b) + other, the add done as the tiles are stored"""
        if x.shape[0] < AMX_MIN_ROWS:
            return self.few_rows.plus(x, other)
        return self.kernels.amx_linear(x, self.parts, self.n, self.k, self.bias, other)


# From this many rows oneDNN's fp32 GEMM runs instead, by the FMA GEMM's
# register width (floats); None: never, and no oneDNN copy is kept.
# ymm, measured on the 2-core AVX2 machines (AMD EPYC, Zen 3) once the
# panels went to the first thread free: 30 distinct weights of each of the
# decoder's shapes, GFLOP/s FMA / oneDNN, 64 rows 122-153 / 98-130, 512
# rows 158-164 / 139-150, 2048 rows 150-161 / 148-153; a prefill step of 512
# tokens 876 vs 951 ms (paired, one process). zmm, measured on a 2-core Zen 4
# (whole runner steps, FMA against oneDNN, before that change): decode of 1
# sequence 0.72x, 8 0.94x, 57 0.97x; prefill of 64 rows 0.95x, 128 1.02x,
# 192 1.06x, 250 1.07x; on a Zen 5 the GEMMs alone fell behind oneDNN from
# 128 rows too. Later, on a Zen 4 (the GEMMs alone, 30 layers x 4 shapes, ms
# FMA / oneDNN): 64 rows 70.5 / 71.8, 96 109 / 106, 104 127 / 114, 116
# 139 / 125; whole prefill steps, bound 104 against 128 (paired, one
# process): 104 rows 0.95x, 112 0.93x, 124 0.92x, 96 the same
# (docs/benchmarks.md).
FMA_MAX_ROWS: dict[int, int | None] = {8: None, 16: 104}


class FmaLinear:
    """y = x @ weight.T + bias on FMA lanes (kernels/fma_gemm.cpp: ymm on
    AVX2, zmm on AVX-512); where the register width has a `max_rows`, steps
    of that many rows or more run on oneDNN's packed copy of the weight
    (both copies kept: 2x the fp32 bytes)."""

    __slots__ = ("packed", "bias", "n", "k", "kernels", "many_rows", "max_rows")

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, kernels: CpuKernels, few_rows_only: bool = False
    ) -> None:
        """`few_rows_only`: every step runs on the FMA GEMM and no oneDNN
        copy is kept (AmxLinear sends it only its steps of few rows)."""
        weight = weight.detach().contiguous()
        self.packed = kernels.fma_pack_weight(weight)
        self.bias = None if bias is None else bias.detach().contiguous()
        self.n, self.k = weight.shape
        self.kernels = kernels
        self.max_rows = None if few_rows_only else FMA_MAX_ROWS[kernels.fma_vector_floats()]
        self.many_rows = None if self.max_rows is None else PackedLinear(weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.max_rows is not None and x.shape[0] >= self.max_rows and self.many_rows is not None:
            return self.many_rows(x)
        return self.kernels.fma_linear(x, self.packed, self.n, self.k, self.bias)

    def plus(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        """(x @ W.T + b) + other, the add done as the results are stored"""
        if self.max_rows is not None and x.shape[0] >= self.max_rows and self.many_rows is not None:
            return self.many_rows.plus(x, other)
        return self.kernels.fma_linear(x, self.packed, self.n, self.k, self.bias, other)


Linear = TorchLinear | PackedLinear | AmxLinear | FmaLinear
LinearMaker = Callable[[torch.Tensor, "torch.Tensor | None"], Linear]  # (weight, bias) -> a projection


def projection_makers(linear_backend: str, kernels: CpuKernels | None) -> tuple[LinearMaker, LinearMaker]:
    """How the decoder's projections and the LM head's packed copy are made
    for a `linear_backend` other than "torch" (fp32 CPU). "auto": AMX tiles
    where the CPU has AMX-BF16; else the FMA GEMM wherever the kernels build
    it: for every step on AVX2, for steps of few rows on AVX-512 with oneDNN
    for the rest (FmaLinear).
    On AVX-512 it was once left out (a Zen 5 and a Zen 4 measured the
    offline workload no faster on it); measured again on the Zen 4, a decode
    step of one sequence took 0.72x oneDNN's time and the offline workload
    ran 1.07x and 1.09x (two A/Bs of 4 interleaved rounds, docs/benchmarks.md):
    inside a step each oneDNN call costs ~40-65 us of dispatch, 120 calls a
    step. The LM head's packed copy: on ymm (no row bound) the FMA GEMM's
    too, which reads few rows' weights as one stream (Zen 3, with the
    argmax: 4 rows 4.9 vs 6.5 ms on oneDNN, 16 rows 8.5 vs 10.9, 64 rows
    27.9 vs 30.7); on zmm oneDNN's, which was faster there from 16 rows at
    49k columns (64 rows 37 vs 43 ms)."""
    onednn: LinearMaker = PackedLinear
    if linear_backend == "onednn":
        return onednn, onednn
    if linear_backend == "auto" and kernels is not None and kernels.amx_gemm_supported():

        def amx(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
            return AmxLinear(weight, bias, kernels)

        return amx, amx
    fma_capable = kernels is not None and kernels.fma_gemm_supported()
    if linear_backend == "fma" and not fma_capable:
        raise ValueError("linear_backend 'fma': the native kernels do not target AVX2 + FMA on this CPU")
    if linear_backend == "fma" or fma_capable:

        def fma(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
            # type-ignored below: kernels is not None when fma_capable or 'fma' was accepted above
            return FmaLinear(weight, bias, kernels)  # type: ignore[arg-type]

        # type-ignored below: as above: the FMA path has kernels
        unbounded = FMA_MAX_ROWS[kernels.fma_vector_floats()] is None  # type: ignore[union-attr]
        return fma, fma if unbounded else onednn
    return onednn, onednn


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
