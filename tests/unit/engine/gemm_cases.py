"""One projection case for the native GEMM tests (AMX, FMA): random fp32
inputs, their float64 result and `F.linear`'s, so a kernel's error can be
held to an fp32 GEMM's."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class GemmCase:
    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    residual: torch.Tensor | None
    exact: torch.Tensor   # float64
    fp32: torch.Tensor    # F.linear (MKL's sgemm) + residual

    @classmethod
    def random(cls, m: int, n: int, k: int, bias: bool, residual: bool) -> "GemmCase":
        gen = torch.Generator().manual_seed(m * n + k)
        weight = torch.randn(n, k, generator=gen) * 0.05
        x = torch.randn(m, k, generator=gen)
        b = torch.randn(n, generator=gen) if bias else None
        r = torch.randn(m, n, generator=gen) if residual else None
        exact = x.double() @ weight.double().T
        fp32 = F.linear(x, weight, b)
        if b is not None:
            exact = exact + b.double()
        if r is not None:
            exact, fp32 = exact + r.double(), fp32 + r
        return cls(x, weight, b, r, exact, fp32)

    def relative_error(self, result: torch.Tensor) -> float:
        return ((result.double() - self.exact).abs().max() / self.exact.abs().max()).item()

    def within_fp32(self, result: torch.Tensor) -> bool:
        """The same order as MKL's sgemm error (~1e-7 relative)."""
        return self.relative_error(result) <= 2 * self.relative_error(self.fp32) + 1e-7
