"""A model folder with the shape of a real one and seeded random weights.

For a machine the real weights cannot reach: the device machines lent to
some sessions take a working tree of at most 64 MiB and reach no registry,
and the default model's package alone is 98 MB. Only the shape travels
(`config.json`, the tokenizer files: ~3.5 MB), staged here with `stage`;
the weights are drawn there with `build`, from a seed.

Speed does not depend on the weights' values, so a throughput row on such a
folder measures what the real model would give. Outputs do: tokens from
random weights are compared engine against HF only, never against the real
model's, and near-ties are likelier (the logits are flatter than a trained
model's).

    python -m bench.random_model stage --out .device/model-shape
    python -m bench.random_model build --shape .device/model-shape --out /tmp/model --seed 0
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

# what describes a model without its weights: read by the engine (config),
# the bench's workload (tokenizer, config) and HF (all of them)
SHAPE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
REQUIRED_SHAPE_FILES = ("config.json", "tokenizer.json")
WEIGHTS_GLOBS = ("*.safetensors", "*.bin", "*.gguf")


def stage_shape(model_dir: Path, out: Path) -> Path:
    """Copy a model folder's shape files (no weights) into `out`."""
    missing = [name for name in REQUIRED_SHAPE_FILES if not (model_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{model_dir}: no {', '.join(missing)} (not a Hugging Face model folder)")
    out.mkdir(parents=True, exist_ok=True)
    for name in SHAPE_FILES:
        if (model_dir / name).is_file():
            shutil.copy2(model_dir / name, out / name)
    return out


def has_weights(model_dir: Path) -> bool:
    return any(any(model_dir.glob(pattern)) for pattern in WEIGHTS_GLOBS)


def build_random_model(shape_dir: Path, out: Path, seed: int) -> Path:
    """`out`: the shape files of `shape_dir` and fp32 weights drawn from
    `seed` by the model class's own initialisation. The same seed gives the
    same weights on any machine of the same torch version."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    missing = [name for name in REQUIRED_SHAPE_FILES if not (shape_dir / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{shape_dir}: no {', '.join(missing)}; stage it first (`stage`)")
    config = AutoConfig.from_pretrained(shape_dir)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    stage_shape(shape_dir, out)
    model.save_pretrained(out)
    # save_pretrained rewrites config.json (its own defaults): keep the
    # shape's, which is what the real model's folder would hold
    shutil.copy2(shape_dir / "config.json", out / "config.json")
    (out / "random_weights.json").write_text(json.dumps({"seed": seed, "shape": str(shape_dir)}) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.random_model", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    stage = verbs.add_parser("stage", help="copy a model folder's shape files (default: the default model)")
    stage.add_argument("--model-dir", default=None)
    stage.add_argument("--out", required=True)
    build = verbs.add_parser("build", help="a folder of that shape with seeded random weights")
    build.add_argument("--shape", required=True)
    build.add_argument("--out", required=True)
    build.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.verb == "stage":
        if args.model_dir is None:
            from serving.default_model import ensure_default_model

            args.model_dir = str(ensure_default_model())
        print(stage_shape(Path(args.model_dir), Path(args.out)))
    else:
        print(build_random_model(Path(args.shape), Path(args.out), args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
