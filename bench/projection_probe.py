"""A decode step's projections on this machine, each way the engine can run
them (`models/packed_linear.py`): oneDNN on the packed fp32 weight, the FMA
GEMM (where the kernels build it), AMX tiles (where the CPU has AMX-BF16),
and what `linear_backend: auto` picks here. Times the four projections of
every decoder layer (qkv, o, gate_up, down) with distinct weights per layer,
so that the weights stream from memory as in a real step instead of sitting
in cache.

    python -m bench.projection_probe [--rows 1 8 16 24 32 64] [--repeats 9] [--shapes down] [--baseline REV]

Shapes are the default model's (SmolLM2-135M: hidden 576, 3 KV heads of 64,
MLP 1536, 30 layers), fp32, random weights; the ways run interleaved so that
the machine's drift hits all. Prints medians in ms. With `--baseline REV`
the FMA GEMM built from that revision's sources is one more way, and each
row count's outputs of the two FMA GEMMs are compared bit for bit.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime

import torch

from python_llm.engine.worker.kernels import CpuKernels
from python_llm.engine.worker.models.packed_linear import FmaLinear, PackedLinear, projection_makers

from .kernel_probe import baseline_kernels, parse_probe_args, probe_parser

Projection = Callable[[torch.Tensor], torch.Tensor]
FMA = "FMA GEMM"
# (output features, input features) of qkv, o, gate_up, down
SHAPES = {"qkv": (576 + 2 * 3 * 64, 576), "o": (576, 576), "gate_up": (2 * 1536, 576), "down": (576, 1536)}


class AmxTilesOnly:
    """AMX tiles for every step (AmxLinear hands few rows to an fp32 copy)."""

    def __init__(self, weight: torch.Tensor, kernels: CpuKernels) -> None:
        self.parts = kernels.amx_pack_weight(weight.contiguous())
        self.n, self.k = weight.shape
        self.kernels = kernels

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernels.amx_linear(x, self.parts, self.n, self.k, None)


def main(argv: list[str] | None = None) -> int:
    parser = probe_parser(__doc__, rows=[1, 8, 16, 24, 32, 64], repeats=9)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument(
        "--shapes",
        nargs="+",
        choices=tuple(SHAPES),
        default=list(SHAPES),
        help="time only these projections (one at a time: its own ms)",
    )
    parser.add_argument("--baseline", help="a git revision whose FMA GEMM runs beside the working tree's")
    args, kernels = parse_probe_args(parser, argv)
    if kernels is None:
        return 1
    if args.baseline and not kernels.fma_gemm_supported():
        print("--baseline times the FMA GEMM, which does not build here")
        return 1
    return _probe(args, kernels, baseline_kernels(args.baseline) if args.baseline else None)


def _probe(args: argparse.Namespace, kernels: CpuKernels, baseline: CpuKernels | None) -> int:
    shapes = [SHAPES[name] for name in args.shapes]
    gen = torch.Generator().manual_seed(0)
    weights = [[torch.randn(n, k, generator=gen) * 0.02 for n, k in shapes] for _ in range(args.layers)]
    makers: dict[str, Callable[[torch.Tensor], Projection]] = {"oneDNN": lambda w: PackedLinear(w, None)}
    if kernels.fma_gemm_supported():
        makers[FMA] = lambda w: FmaLinear(w, None, kernels, few_rows_only=True)
    if baseline is not None:
        makers[f"{FMA} @{args.baseline}"] = lambda w: FmaLinear(w, None, baseline, few_rows_only=True)
    if kernels.amx_gemm_supported():
        makers["AMX tiles"] = lambda w: AmxTilesOnly(w, kernels)
    auto, _ = projection_makers("auto", kernels)
    makers["auto"] = lambda w: auto(w, None)
    ways = {name: [[make(w) for w in layer] for layer in weights] for name, make in makers.items()}
    print(
        f"# projection probe, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{args.threads} threads, {args.layers} layers x {'/'.join(args.shapes)}, fp32; "
        f"auto = {type(ways['auto'][0][0]).__name__}"
    )
    compared = baseline is not None
    print("| rows | " + " | ".join(ways) + " |" + (" FMA outputs |" if compared else ""))
    print("|---:|" + "---:|" * len(ways) + ("---|" if compared else ""))
    for rows in args.rows:
        inputs = {k: torch.randn(rows, k, generator=gen) for _, k in shapes}
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        for _ in range(args.repeats):  # interleaved, so that drift hits every way alike
            for name, layers in ways.items():
                started = time.perf_counter()
                for layer in layers:
                    for linear, (_, k) in zip(layer, shapes):
                        linear(inputs[k])
                seconds[name].append(time.perf_counter() - started)
        cells = [f"{statistics.median(s) * 1e3:.1f}" for s in seconds.values()]
        if compared:
            cells.append(
                "identical"
                if _same_outputs(ways[FMA], ways[f"{FMA} @{args.baseline}"], inputs, shapes)
                else "DIFFERENT"
            )
        print(f"| {rows} | " + " | ".join(cells) + " |")
    return 0


def _same_outputs(
    ours: list[list[Projection]],
    theirs: list[list[Projection]],
    inputs: dict[int, torch.Tensor],
    shapes: list[tuple[int, int]],
) -> bool:
    return all(
        torch.equal(a(inputs[k]), b(inputs[k]))
        for layer_a, layer_b in zip(ours, theirs)
        for a, b, (_, k) in zip(layer_a, layer_b, shapes)
    )


if __name__ == "__main__":
    raise SystemExit(main())
