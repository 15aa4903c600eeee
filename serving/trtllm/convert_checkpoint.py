"""A Hugging Face model folder -> a TensorRT-LLM checkpoint with TP x PP ranks,
through TensorRT-LLM's own Python API (what its examples' convert_checkpoint.py
scripts call): the architecture's class from `tensorrt_llm.models.MODEL_MAP`,
`from_hugging_face(..., mapping=Mapping(world_size, rank, tp_size, pp_size))`
and `save_checkpoint` once per rank (the config with rank 0).

Standalone on purpose: `python -m serving build-trtllm` runs it with the Python
that has TensorRT-LLM (the container's system Python 3.10 in
nvcr.io/nvidia/tritonserver:24.10-trtllm-python-py3), which does not have this
project's dependencies. It imports only the standard library and tensorrt_llm.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--tp", type=int, required=True)
    parser.add_argument("--pp", type=int, required=True)
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args(argv)

    from tensorrt_llm.mapping import Mapping
    from tensorrt_llm.models import MODEL_MAP

    config = json.loads((Path(args.model_dir) / "config.json").read_text())
    architectures = config.get("architectures") or []
    supported = [name for name in architectures if name in MODEL_MAP]
    if not supported:
        print(
            f"convert_checkpoint: TensorRT-LLM has no model class for {architectures or 'this model'}", file=sys.stderr
        )
        return 1
    model_class = MODEL_MAP[supported[0]]
    world_size = args.tp * args.pp
    for rank in range(world_size):
        mapping = Mapping(world_size=world_size, rank=rank, tp_size=args.tp, pp_size=args.pp)
        model = model_class.from_hugging_face(args.model_dir, dtype=args.dtype, mapping=mapping)
        model.save_checkpoint(args.output_dir, save_config=(rank == 0))
        del model
        print(f"convert_checkpoint: rank {rank + 1} of {world_size} written to {args.output_dir}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
