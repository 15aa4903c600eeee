"""What the kernel probes (`lm_head_probe`, `projection_probe`) share: their
command line (rows, repeats, threads) and the native kernels they time."""
from __future__ import annotations

import argparse

import torch

from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels


def probe_parser(doc: str | None, rows: list[int], repeats: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=rows)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def parse_probe_args(parser: argparse.ArgumentParser) -> tuple[argparse.Namespace, CpuKernels | None]:
    """The command line, and the kernels with torch on `--threads` threads;
    None (said) where they do not build."""
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    kernels = cpu_kernels()
    if kernels is None:
        print("the native kernels are not available here")
    return args, kernels
