"""The LM head of greedy decoding on this machine, six ways: PyTorch's
GEMM in vocabulary slices (the path without packed weights), oneDNN on the
packed weight (`PackedLinear`) and the FMA GEMM (`FmaLinear`, where the
kernels build it), each plus the native argmax (the engine runs the packed
copy `projection_makers` makes for the LM head from LM_HEAD_GEMM_MIN_ROWS
rows), against the native LM head fused with its argmax
(`kernels/lm_head_argmax.cpp`, fewer rows), and the bf16 LM head with the
exact argmax over its candidates (`models/greedy_head.py`, what
`greedy_lm_head: auto` runs where the CPU has bf16 dot products; on other
CPUs oneDNN emulates bf16 and it is slow), and the int16 LM head with the
exact argmax over its candidates (`models/int16_greedy_head.py`, what `auto`
runs on other AVX2 CPUs).

    python -m bench.lm_head_probe [--rows 1 2 4 8 16 64] [--repeats 15]

Shapes are the default model's (SmolLM2-135M: vocabulary 49,152, hidden 576),
fp32, random weights; the ways run interleaved so that the machine's drift
hits all. Prints medians and whether all chose the same ids.
"""

from __future__ import annotations

import platform
import statistics
import time
from datetime import UTC, datetime

import torch

from python_llm.engine.worker.models.greedy_head import VerifiedGreedyHead
from python_llm.engine.worker.models.int16_greedy_head import Int16GreedyHead
from python_llm.engine.worker.models.llama import sliced_lm_head
from python_llm.engine.worker.models.packed_linear import FmaLinear, PackedLinear

from .kernel_probe import parse_probe_args, probe_parser


def main() -> int:
    parser = probe_parser(__doc__, rows=[1, 2, 4, 8, 16, 64], repeats=15)
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    args, kernels = parse_probe_args(parser)
    if kernels is None:
        return 1
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=gen) * 0.05
    print(
        f"# LM head probe, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
        f"{args.threads} threads, vocab {args.vocab}, hidden {args.hidden}, fp32; "
        f"bf16 dot products native: {kernels.bf16_dot_supported()}"
    )
    packed = PackedLinear(weight, None)
    fma = FmaLinear(weight, None, kernels) if kernels.fma_gemm_supported() else None
    verified = VerifiedGreedyHead(weight, kernels)
    int16 = Int16GreedyHead(weight, kernels)
    ways = {
        "GEMM slices + argmax": lambda h: kernels.argmax_rows(sliced_lm_head(h, weight)).tolist(),
        "oneDNN packed + argmax": lambda h: kernels.argmax_rows(packed(h)).tolist(),
        **({"FMA GEMM + argmax": lambda h: kernels.argmax_rows(fma(h)).tolist()} if fma is not None else {}),
        "fused LM head + argmax": lambda h: kernels.lm_head_argmax(h, weight),
        "bf16 + verified argmax": lambda h: verified(h)[0],
        "int16 + verified argmax": lambda h: int16(h)[0],
    }
    print("| rows | " + " | ".join(ways) + " | same ids |")
    print("|---:|" + "---:|" * len(ways) + "---|")
    for rows in args.rows:
        hidden = torch.randn(rows, args.hidden, generator=gen)
        seconds: dict[str, list[float]] = {name: [] for name in ways}
        same = True
        for _ in range(args.repeats):  # interleaved, so that drift hits every way alike
            answers = []
            for name, way in ways.items():
                started = time.perf_counter()
                answers.append(way(hidden))
                seconds[name].append(time.perf_counter() - started)
            same &= all(answer == answers[0] for answer in answers)
        cells = " | ".join(f"{statistics.median(s) * 1e3:.2f} ms" for s in seconds.values())
        print(f"| {rows} | {cells} | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
