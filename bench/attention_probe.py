"""The prefill attention kernel on this machine: a chunk of `--tokens` after
`--start` cached positions, through `--layers` layers of distinct K/V
caches with their blocks shuffled (as a long-running cache places them), on
`--threads` threads. With `--baseline REV` the kernels built from that
revision's sources run in the same process, calls alternated, so that the
machine's drift hits both (it moves by 10-20% over minutes here: two
separate runs compare nothing); their outputs are compared bit for bit.

    python -m bench.attention_probe [--start 7008] [--tokens 512 112 32] [--baseline REV] [--rounds 7]

Shapes are the default model's (SmolLM2-135M: 9 query heads on 3 KV heads
of 64; the engine's default block size), fp32, random values. Prints medians in ms over the
rounds after the first, and GFLOP/s of the chunk's QK^T and PV.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import UTC, datetime

import torch

from python_llm.engine.config import EngineConfig
from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels

from .kernel_probe import baseline_kernels

HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64  # SmolLM2-135M's
BLOCK = EngineConfig.block_size  # the engine's default


def flops(start: int, tokens: int, layers: int) -> float:
    """Multiply-adds x 2 of a chunk's QK^T and PV (token i sees start + i + 1 keys)."""
    keys = tokens * start + tokens * (tokens + 1) / 2
    return 2 * 2 * keys * HEADS * HEAD_DIM * layers


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--start", type=int, default=7008, help="cached positions before the chunk")
    parser.add_argument("--tokens", type=int, nargs="+", default=[512, 112, 32], help="chunk sizes")
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--baseline", help="a git revision whose kernels run beside the working tree's")
    args = parser.parse_args(argv)
    if args.start < 0 or min(args.tokens) < 1 or args.layers < 1 or args.rounds < 2:
        parser.error("--start >= 0, --tokens >= 1, --layers >= 1 and --rounds >= 2")
    torch.set_num_threads(args.threads)
    current = cpu_kernels()
    if current is None or not current.prefill_attention_supported(HEAD_DIM):
        print("the native prefill attention is not available here")
        return 1
    libraries = {"current": current}
    if args.baseline:
        libraries = {"baseline": baseline_kernels(args.baseline), **libraries}
    return _probe(args, libraries)


def _probe(args: argparse.Namespace, libraries: dict[str, CpuKernels]) -> int:
    gen = torch.Generator().manual_seed(0)
    num_blocks = -(-(args.start + max(args.tokens)) // BLOCK) + 1
    caches = [
        (
            torch.randn(KV_HEADS, num_blocks, BLOCK, HEAD_DIM, generator=gen),
            torch.randn(KV_HEADS, num_blocks, BLOCK, HEAD_DIM, generator=gen),
        )
        for _ in range(args.layers)
    ]
    shuffled = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    print(
        f"{platform.node()}: {torch.get_num_threads()} threads, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC; "
        f"{args.layers} layers, chunks after {args.start} cached positions"
    )
    seconds: dict[tuple[int, str], list[float]] = {}
    differ: set[int] = set()
    for round_no in range(args.rounds):
        for tokens in args.tokens:
            query = torch.randn(tokens, HEADS, HEAD_DIM, generator=gen)
            table = shuffled[: -(-(args.start + tokens) // BLOCK)].contiguous()
            order = list(libraries.items())
            if round_no % 2:
                order.reverse()
            outputs = []
            for name, kernels in order:
                out = torch.empty(tokens, HEADS * HEAD_DIM)
                started = time.perf_counter()
                for key_cache, value_cache in caches:
                    kernels.paged_prefill_attention(
                        out, query, key_cache, value_cache, table, args.start, HEAD_DIM**-0.5, check=False
                    )
                elapsed = time.perf_counter() - started
                outputs.append(out)
                if round_no:  # the first round warms caches and thread pools
                    seconds.setdefault((tokens, name), []).append(elapsed)
            if any(not torch.equal(outputs[0], other) for other in outputs[1:]):
                differ.add(tokens)
    for tokens in args.tokens:
        medians = {name: statistics.median(seconds[(tokens, name)]) for name in libraries}
        cells = [
            f"{name} {s * 1e3:8.1f} ms ({flops(args.start, tokens, args.layers) / s / 1e9:5.0f} GFLOP/s)"
            for name, s in medians.items()
        ]
        if "baseline" in medians:
            cells.append(f"current / baseline time {medians['current'] / medians['baseline']:.3f}")
            cells.append("outputs differ" if tokens in differ else "outputs identical")
        print(f"{tokens:5d} tokens: " + "  ".join(cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
