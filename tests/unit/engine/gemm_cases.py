"""One projection case for the native GEMM tests (AMX, FMA): random fp32
inputs and their float64 result, so a kernel's error can be held to an fp32
GEMM's bound."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GemmCase:
    x: torch.Tensor
    weight: torch.Tensor
    bias: torch.Tensor | None
    residual: torch.Tensor | None
    exact: torch.Tensor  # float64

    @classmethod
    def random(cls, m: int, n: int, k: int, bias: bool, residual: bool) -> GemmCase:
        gen = torch.Generator().manual_seed(m * n + k)
        weight = torch.randn(n, k, generator=gen) * 0.05
        x = torch.randn(m, k, generator=gen)
        b = torch.randn(n, generator=gen) if bias else None
        r = torch.randn(m, n, generator=gen) if residual else None
        exact = x.double() @ weight.double().T
        if b is not None:
            exact = exact + b.double()
        if r is not None:
            exact = exact + r.double()
        return cls(x, weight, b, r, exact)

    def fp32_error_bound(self) -> torch.Tensor:
        """Per element, the classical bound of any fp32 GEMM, whatever its order
        of summation or use of FMA (Higham, "Accuracy and Stability of Numerical
        Algorithms", 3.1): gamma(k + 2) * (|x| |w|^T + |bias| + |residual|),
        gamma(n) = n u / (1 - n u), u = 2^-24. Machine-independent, where MKL's
        own error is not (its small shapes sum in a different order on AVX-512
        than on AVX2); bf16 products (~4e-3) break it by orders of magnitude."""
        k = self.x.shape[1]
        unit = 2.0**-24
        gamma = (k + 2) * unit / (1 - (k + 2) * unit)
        magnitude = self.x.double().abs() @ self.weight.double().abs().T
        if self.bias is not None:
            magnitude = magnitude + self.bias.double().abs()
        if self.residual is not None:
            magnitude = magnitude + self.residual.double().abs()
        return gamma * magnitude

    def within_fp32(self, result: torch.Tensor) -> bool:
        """An fp32 GEMM's error: every element within `fp32_error_bound`."""
        return bool(((result.double() - self.exact).abs() <= self.fp32_error_bound()).all())
