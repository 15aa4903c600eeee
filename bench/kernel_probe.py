"""What the kernel probes (`lm_head_probe`, `projection_probe`,
`attention_probe`) share: their command line (rows, repeats, threads), the
native kernels they time, and another revision's kernels to time beside
them."""

from __future__ import annotations

import argparse
import io
import subprocess
import tarfile
import tempfile
from pathlib import Path

import torch

from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels
from python_llm.engine.worker.kernels.library import build

REPO = Path(__file__).resolve().parents[1]
KERNELS = "backends/python_llm/engine/worker/kernels"


def probe_parser(doc: str | None, rows: list[int], repeats: int) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=rows)
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def parse_probe_args(
    parser: argparse.ArgumentParser, argv: list[str] | None = None
) -> tuple[argparse.Namespace, CpuKernels | None]:
    """The command line, and the kernels with torch on `--threads` threads;
    None (said) where they do not build."""
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    kernels = cpu_kernels()
    if kernels is None:
        print("the native kernels are not available here")
    return args, kernels


def baseline_kernels(rev: str) -> CpuKernels:
    """The kernels library as revision `rev` builds it. Built in a directory
    removed once the library is loaded (a loaded library outlives its file)."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev, KERNELS], check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(workdir, filter="data")
        sources = sorted((workdir / KERNELS).glob("*.cpp"))
        return CpuKernels(build(workdir / f"baseline-{rev}.so", sources))
