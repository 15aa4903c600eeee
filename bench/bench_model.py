"""Which model, and on which device, a bench runs: the arguments every bench
that builds an engine shares (`--model-dir`, `--device`, `--random-weights`)
and the folder they resolve to."""

from __future__ import annotations

import argparse
import gc
import tempfile
from contextlib import ExitStack
from pathlib import Path

from .random_model import build_random_model


def add_model_arguments(parser: argparse.ArgumentParser, device_rows: str = "") -> None:
    parser.add_argument("--model-dir", default=None, help="a Hugging Face folder (default: the default model)")
    parser.add_argument(
        "--device", default="cpu", help="cpu, or cuda[:N]" + (f" ({device_rows})" if device_rows else "")
    )
    parser.add_argument(
        "--random-weights",
        type=int,
        default=None,
        metavar="SEED",
        help="the model folder's shape (config, tokenizer) with weights drawn from SEED, for "
        "a machine the real weights cannot reach (bench.random_model); speed only",
    )


def check_device(parser: argparse.ArgumentParser, device: str) -> None:
    if not (device == "cpu" or device.startswith("cuda")):
        parser.error(f"--device: cpu or cuda[:N], got {device!r}")


def bench_model_dir(model_dir: str | None, random_weights: int | None, temporary: ExitStack) -> str:
    """The folder a bench loads: `model_dir` or the default model; with
    `random_weights` (a seed), that folder's shape with weights drawn from
    it, in a temporary folder `temporary` removes."""
    if model_dir is None:
        from serving.default_model import ensure_default_model

        model_dir = str(ensure_default_model())
    if random_weights is None:
        return model_dir
    folder = Path(temporary.enter_context(tempfile.TemporaryDirectory(prefix="bench-random-model-")))
    return str(build_random_model(Path(model_dir), folder, random_weights))


def release_memory() -> None:
    """Collect, and give a GPU's cached blocks back to its driver: an engine
    on CUDA sizes its KV cache as a share of the memory free, so the next
    engine of the same process then gets what the first one got."""
    gc.collect()
    import torch

    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()
