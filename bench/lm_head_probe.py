"""The LM head of greedy decoding on this machine: PyTorch's GEMM in
vocabulary slices (the engine's unfused path) plus the native argmax, against
the native LM head fused with its argmax (`kernels/lm_head_argmax.cpp`).

    python -m bench.lm_head_probe [--rows 1 8 64] [--repeats 15]

Shapes are the default model's (SmolLM2-135M: vocabulary 49,152, hidden 576),
fp32, random weights; the two paths run interleaved so that the machine's
drift hits both. Prints medians and whether both chose the same ids.
"""
from __future__ import annotations

import argparse
import platform
import statistics
import time
from datetime import datetime, timezone

import torch

from python_llm.engine.worker.kernels import cpu_kernels
from python_llm.engine.worker.models.llama import sliced_lm_head


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels = cpu_kernels()
    if kernels is None:
        print("the native kernels are not available here")
        return 1
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(args.vocab, args.hidden, generator=gen) * 0.05
    print(f"# LM head probe, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {platform.node()}, "
          f"{args.threads} threads, vocab {args.vocab}, hidden {args.hidden}, fp32")
    print("| rows | GEMM slices | + argmax | fused LM head + argmax | same ids |")
    print("|---:|---:|---:|---:|---|")
    for rows in args.rows:
        hidden = torch.randn(rows, args.hidden, generator=gen)
        gemm, argmax, fused = [], [], []
        same = True
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            logits = sliced_lm_head(hidden, weight)
            t1 = time.perf_counter()
            ids = kernels.argmax_rows(logits).tolist()
            t2 = time.perf_counter()
            fused_ids = kernels.lm_head_argmax(hidden, weight)
            t3 = time.perf_counter()
            gemm.append(t1 - t0)
            argmax.append(t2 - t1)
            fused.append(t3 - t2)
            same &= ids == fused_ids
        ms = [statistics.median(x) * 1e3 for x in (gemm, argmax, fused)]
        print(f"| {rows} | {ms[0]:.2f} ms | {ms[1]:.2f} ms | {ms[2]:.2f} ms | {'yes' if same else 'NO'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
