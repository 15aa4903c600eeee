"""Build the CPU kernels ahead of time and check them against PyTorch
(SDPA for the decode attention, torch.argmax for the argmax, a float64 GEMM
+ argmax for the fused LM head, PyTorch's ops for RMSNorm and SiLU x up,
float64 for the AMX projection where the CPU has AMX).

    python -m python_llm.engine.worker.kernels

Exit status 0 when it is built and agrees; 1 when it cannot be built here
(the engine then uses its PyTorch paths).
"""

from __future__ import annotations

import logging
import sys

import torch

from . import cpu_kernels, library_path
from .reference import decode_attention_reference, prefill_attention_reference


def self_check(kernels) -> float:
    """Largest difference from SDPA over a small ragged GQA batch (fp32)."""
    gen = torch.Generator().manual_seed(0)
    kv_heads, heads, head_dim, block_size = 3, 9, 64, 16
    keys = torch.randn(kv_heads, 32, block_size, head_dim, generator=gen)
    values = torch.randn(kv_heads, 32, block_size, head_dim, generator=gen)
    lens = [1, 17, 100]
    tables = [[5], [9, 2], [30, 1, 7, 4, 11, 20, 3]]
    query = torch.randn(len(lens), heads, head_dim, generator=gen)
    padded = torch.tensor([t + [0] * (7 - len(t)) for t in tables], dtype=torch.int32)
    out = torch.empty(len(lens), heads * head_dim)
    kernels.paged_decode_attention(
        out, query, keys, values, padded, torch.tensor(lens, dtype=torch.int64), head_dim**-0.5
    )
    expected = decode_attention_reference(query, keys, values, tables, lens, head_dim**-0.5)
    return (out - expected).abs().max().item()


def prefill_check(kernels) -> float:
    """Largest difference of the prefill-chunk kernel from the PyTorch path
    (gather + offset mask + SDPA) for a chunk continuing a cached prefix; 0
    when this CPU has no vectorized prefill kernel (the engine then uses that path)."""
    if not kernels.prefill_attention_supported(64):
        return 0.0
    gen = torch.Generator().manual_seed(3)
    keys, values = torch.randn(3, 32, 16, 64, generator=gen), torch.randn(3, 32, 16, 64, generator=gen)
    table = [30, 1, 7, 4, 11, 20, 3, 9]
    query = torch.randn(21, 9, 64, generator=gen)
    out = torch.empty(21, 9 * 64)
    kernels.paged_prefill_attention(out, query, keys, values, torch.tensor(table, dtype=torch.int32), 100, 0.125)
    return (out - prefill_attention_reference(query, keys, values, table, 100, 0.125)).abs().max().item()


def argmax_agrees(kernels) -> bool:
    logits = torch.randn(8, 49157, generator=torch.Generator().manual_seed(1))
    logits[3, [11, 40000]] = 30.0  # a tie: the first one wins
    return torch.equal(kernels.argmax_rows(logits), logits.argmax(dim=-1))


def lm_head_agrees(kernels) -> bool:
    gen = torch.Generator().manual_seed(2)
    hidden, weight = torch.randn(5, 200, generator=gen), torch.randn(3001, 200, generator=gen)
    return kernels.lm_head_argmax(hidden, weight) == (hidden.double() @ weight.double().t()).argmax(-1).tolist()


def verified_argmax_agrees(kernels, precision: str) -> bool:
    """The bf16 or int16 LM head's verified argmax against a float64 GEMM +
    argmax, with a near-tie neither can separate (rows 11 and 12 differ by
    1e-6)."""
    from ..models.greedy_head import GreedyHeads

    gen = torch.Generator().manual_seed(3)
    hidden, weight = torch.randn(5, 200, generator=gen), torch.randn(3001, 200, generator=gen) * 0.05
    weight[11] = hidden[0] / hidden[0].norm()
    weight[12] = weight[11] * (1 + 1e-6)
    tokens, _ = GreedyHeads[precision](weight, kernels)(hidden)
    return tokens == (hidden.double() @ weight.double().t()).argmax(-1).tolist()


def elementwise_check(kernels) -> float:
    """Largest difference of the native RMSNorm and SiLU x up from PyTorch's ops."""
    gen = torch.Generator().manual_seed(4)
    x, weight = torch.randn(7, 96, generator=gen), torch.randn(96, generator=gen)
    gate_up = torch.randn(7, 64, generator=gen)
    norm = weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    gate, up = gate_up.chunk(2, dim=-1)
    return max(
        (kernels.rms_norm(x, weight, 1e-5) - norm).abs().max().item(),
        (kernels.silu_mul(gate_up) - torch.nn.functional.silu(gate) * up).abs().max().item(),
    )


def amx_check(kernels) -> float | None:
    """The AMX projection's error against float64 over MKL's sgemm error (about
    1 for an fp32 GEMM; bf16 alone would be ~1e4); None without AMX here."""
    if not kernels.amx_gemm_supported():
        return None
    gen = torch.Generator().manual_seed(5)
    weight, x = torch.randn(100, 70, generator=gen) * 0.05, torch.randn(40, 70, generator=gen)
    exact = x.double() @ weight.double().t()
    result = kernels.amx_linear(x, kernels.amx_pack_weight(weight), 100, 70, None)
    sgemm = (x @ weight.t()).double()
    return ((result.double() - exact).abs().max() / (sgemm - exact).abs().max().clamp_min(1e-12)).item()


def fma_check(kernels) -> float | None:
    """The FMA projection's error against float64 over MKL's sgemm error
    (about 1 for an fp32 GEMM); None where the build has no AVX2 / FMA."""
    if not kernels.fma_gemm_supported():
        return None
    gen = torch.Generator().manual_seed(6)
    weight, x, bias = (
        torch.randn(100, 70, generator=gen) * 0.05,
        torch.randn(40, 70, generator=gen),
        torch.randn(100, generator=gen),
    )
    exact = x.double() @ weight.double().t() + bias.double()
    result = kernels.fma_linear(x, kernels.fma_pack_weight(weight), 100, 70, bias)
    sgemm = (x @ weight.t() + bias).double()
    return ((result.double() - exact).abs().max() / (sgemm - exact).abs().max().clamp_min(1e-12)).item()


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    print(f"CPU kernels: {library_path()}")
    kernels = cpu_kernels()
    if kernels is None:
        print("not available here: the engine will use its PyTorch paths")
        return 1
    worst = self_check(kernels)
    prefill_worst = prefill_check(kernels)
    argmax_ok = argmax_agrees(kernels)
    lm_head_ok = lm_head_agrees(kernels)
    verified_ok = verified_argmax_agrees(kernels, "bf16")
    int16_ok = verified_argmax_agrees(kernels, "int16")
    elementwise_worst = elementwise_check(kernels)
    amx = amx_check(kernels)
    fma = fma_check(kernels)
    print(
        f"built; decode attention's largest difference from SDPA: {worst:.2e}; prefill attention's "
        f"{prefill_worst:.2e}; "
        f"argmax {'equals' if argmax_ok else 'DIFFERS FROM'} torch.argmax; "
        f"fused LM head {'agrees' if lm_head_ok else 'DISAGREES'} with GEMM + argmax; "
        f"bf16 LM head's verified argmax {'agrees' if verified_ok else 'DISAGREES'} "
        f"(bf16 dot products {'native' if kernels.bf16_dot_supported() else 'emulated'}); "
        f"int16 LM head's {'agrees' if int16_ok else 'DISAGREES'} "
        f"({'AVX2' if kernels.int16_lm_head_supported() else 'scalar'}); "
        f"RMSNorm / SiLU x up within {elementwise_worst:.2e}; "
        + ("no AMX here" if amx is None else f"AMX projection error {amx:.2f}x an fp32 sgemm's")
        + "; "
        + ("no AVX2 / FMA GEMM in this build" if fma is None else f"FMA projection error {fma:.2f}x an fp32 sgemm's")
    )
    return (
        0
        if (
            worst < 1e-4
            and prefill_worst < 1e-4
            and argmax_ok
            and lm_head_ok
            and verified_ok
            and int16_ok
            and elementwise_worst < 1e-5
            and (amx is None or amx < 4.0)
            and (fma is None or fma < 4.0)
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
