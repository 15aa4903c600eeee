"""`python -m serving build-trtllm --tp N --pp M`: the TensorRT-LLM engine the
`tensorrt_llm_engine` model serves, through TensorRT-LLM's own API and CLI:

1. checkpoint: `convert_checkpoint.py` (this folder) with the Python that has
   TensorRT-LLM: one rank per GPU of TP x PP (`Mapping(tp_size, pp_size)`);
2. engine: `trtllm-build --checkpoint_dir ... --workers ...` with the limits of
   the deployment settings: `max_batch_size` = engine.max_num_seqs,
   `max_num_tokens` = engine.max_num_batched_tokens, `max_seq_len` = the
   model's context capped by engine.max_model_len, `tokens_per_block` =
   engine.block_size, a paged KV cache, and paged context FMHA (what KV reuse
   and chunked context need in TensorRT-LLM 0.14).

The engine lands where the rendered repository looks for it
(`<model_dir>/tensorrt_llm_engine`) unless `--output` says otherwise (then give
the same folder to `launch-trtllm --engine-dir`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from python_llm.engine.config import EngineConfig

from .engine_config import default_engine_dir
from .environment import Probes, check_version, find_tensorrt_llm, find_trtllm_build, python_candidates, require_gpus

CONVERT_SCRIPT = Path(__file__).with_name("convert_checkpoint.py")


@dataclass(frozen=True)
class Toolchain:
    python: str  # has tensorrt_llm
    version: str
    trtllm_build: str
    gpus: int


@dataclass(frozen=True)
class BuildPlan:
    model_dir: Path
    engine_dir: Path
    checkpoint_dir: Path
    tp: int
    pp: int
    checkpoint_dtype: str  # auto: the model's own
    max_batch_size: int
    max_num_tokens: int
    max_seq_len: int
    tokens_per_block: int
    paged_context_fmha: bool

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def find_toolchain(tp: int, pp: int, python: str | None = None, probes: Probes = Probes()) -> Toolchain:
    """Everything the build needs, or EnvironmentMissing naming what is not here:
    TensorRT-LLM first (without it nothing else matters), then the GPUs."""
    if tp < 1 or pp < 1:
        raise ValueError(f"--tp and --pp must be >= 1, got tp {tp}, pp {pp}")
    interpreter, version = find_tensorrt_llm(python_candidates(python, probes), probes)
    check_version(version)
    build = find_trtllm_build(interpreter, probes)
    gpus = require_gpus(tp * pp, tp, pp, probes)
    return Toolchain(interpreter, version, build, gpus)


def plan_build(
    engine: EngineConfig, max_seq_len: int, tp: int, pp: int, checkpoint_dtype: str, output: Path | None = None
) -> BuildPlan:
    engine_dir = Path(output) if output else default_engine_dir(engine.model_dir)
    return BuildPlan(
        model_dir=Path(engine.model_dir),
        engine_dir=engine_dir,
        checkpoint_dir=engine_dir.with_name(engine_dir.name + "_checkpoint"),
        tp=tp,
        pp=pp,
        checkpoint_dtype=checkpoint_dtype,
        max_batch_size=engine.max_num_seqs,
        max_num_tokens=engine.max_num_batched_tokens,
        max_seq_len=max_seq_len,
        tokens_per_block=engine.block_size,
        paged_context_fmha=engine.enable_kv_cache_reuse or engine.enable_chunked_context,
    )


def convert_command(plan: BuildPlan, tools: Toolchain) -> list[str]:
    return [
        tools.python,
        str(CONVERT_SCRIPT),
        "--model-dir",
        str(plan.model_dir),
        "--output-dir",
        str(plan.checkpoint_dir),
        "--tp",
        str(plan.tp),
        "--pp",
        str(plan.pp),
        "--dtype",
        plan.checkpoint_dtype,
    ]


def build_command(plan: BuildPlan, tools: Toolchain) -> list[str]:
    command = [
        tools.trtllm_build,
        "--checkpoint_dir",
        str(plan.checkpoint_dir),
        "--output_dir",
        str(plan.engine_dir),
        "--workers",
        str(min(plan.world_size, tools.gpus)),
        "--max_batch_size",
        str(plan.max_batch_size),
        "--max_num_tokens",
        str(plan.max_num_tokens),
        "--max_seq_len",
        str(plan.max_seq_len),
        "--max_input_len",
        str(plan.max_seq_len - 1),
        "--max_beam_width",
        "1",
        "--tokens_per_block",
        str(plan.tokens_per_block),
        "--kv_cache_type",
        "paged",
        "--remove_input_padding",
        "enable",
        "--context_fmha",
        "enable",
        "--gpt_attention_plugin",
        "auto",
        "--gemm_plugin",
        "auto",
    ]
    if plan.paged_context_fmha:
        command += ["--use_paged_context_fmha", "enable"]
    return command
