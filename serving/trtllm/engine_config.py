"""The `tensorrt_llm_engine` model: TensorRT-LLM's own `tensorrt_llm` model of
`inflight_batcher_llm` (backend `tensorrtllm`), under another name because
`tensorrt_llm` is the LLM step every stage calls (the thin step in front of it,
`backends/python_llm/trtllm_bridge.py`). Every tensor and parameter name here is the one of TensorRT-LLM's
template at the pinned tag (`versions.TEMPLATE_PATH`), with its data type, dims,
`reshape` and `allow_ragged_batch`; tests/unit/serving/test_trtllm_config.py
checks them against the list vendored from that file.

The values come from the deployment settings (`EngineConfig`), by meaning:
the KV budget on GPU, KV reuse, chunked context, the queue bound (Triton's
`default_queue_policy.max_queue_size`, which the backend also hands to the
executor). What TensorRT-LLM fixes when the engine is built (max batch size,
max tokens per step, max sequence length, tokens per KV block) is set by
`python -m serving build-trtllm` from the same settings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from python_llm.engine.config import EngineConfig

from .versions import EXECUTOR_WORKER

ENGINE_MODEL_NAME = "tensorrt_llm_engine"
BACKEND = "tensorrtllm"
# where build-trtllm writes the engine unless told otherwise, and the render looks
ENGINE_SUBDIR = "tensorrt_llm_engine"


def default_engine_dir(model_dir: str | Path) -> Path:
    return Path(model_dir) / ENGINE_SUBDIR


@dataclass(frozen=True)
class EngineTensor:
    name: str
    data_type: str
    dims: tuple[int, ...]
    optional: bool = False
    reshape_scalar: bool = False  # `reshape: { shape: [ ] }`
    ragged: bool = False  # `allow_ragged_batch: true`


def _scalar(name: str, data_type: str, optional: bool = True) -> EngineTensor:
    return EngineTensor(name, data_type, (1,), optional=optional, reshape_scalar=True)


# The inputs the bridge sends (a subset of the template's, each as declared there).
ENGINE_INPUTS: tuple[EngineTensor, ...] = (
    EngineTensor("input_ids", "TYPE_INT32", (-1,), ragged=True),
    _scalar("input_lengths", "TYPE_INT32", optional=False),
    _scalar("request_output_len", "TYPE_INT32", optional=False),
    _scalar("end_id", "TYPE_INT32"),
    _scalar("pad_id", "TYPE_INT32"),
    EngineTensor("stop_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    EngineTensor("bad_words_list", "TYPE_INT32", (2, -1), optional=True, ragged=True),
    _scalar("beam_width", "TYPE_INT32"),
    _scalar("temperature", "TYPE_FP32"),
    _scalar("runtime_top_k", "TYPE_INT32"),
    _scalar("runtime_top_p", "TYPE_FP32"),
    _scalar("len_penalty", "TYPE_FP32"),
    _scalar("repetition_penalty", "TYPE_FP32"),
    _scalar("min_length", "TYPE_INT32"),
    _scalar("presence_penalty", "TYPE_FP32"),
    _scalar("frequency_penalty", "TYPE_FP32"),
    _scalar("random_seed", "TYPE_UINT64"),
    _scalar("return_log_probs", "TYPE_BOOL"),
    _scalar("exclude_input_in_output", "TYPE_BOOL"),
    _scalar("stop", "TYPE_BOOL"),
    _scalar("streaming", "TYPE_BOOL"),
)
# The outputs the bridge reads (the backend requires output_ids and sequence_length).
ENGINE_OUTPUTS: tuple[EngineTensor, ...] = (
    EngineTensor("output_ids", "TYPE_INT32", (-1, -1)),
    EngineTensor("sequence_length", "TYPE_INT32", (-1,)),
    EngineTensor("cum_log_probs", "TYPE_FP32", (-1,)),
    EngineTensor("output_log_probs", "TYPE_FP32", (-1, -1)),
)


def engine_parameters(engine: EngineConfig, engine_dir: str | Path) -> dict[str, str]:
    """The model's `parameters`, under TensorRT-LLM's names. Left out, so the
    backend uses its own default: everything this project has no setting for.
    `max_tokens_in_paged_kv_cache` is python_llm's CPU budget: on the GPU both
    engines size the KV cache by `kv_cache_free_gpu_mem_fraction`."""

    def flag(value: bool) -> str:
        return "true" if value else "false"

    return {
        "max_beam_width": "1",  # one sequence per request
        "FORCE_CPU_ONLY_INPUT_TENSORS": "no",
        "gpt_model_type": "inflight_fused_batching",  # in-flight batching
        "gpt_model_path": str(engine_dir),
        "batch_scheduler_policy": "max_utilization",  # as python_llm: admit, preempt when short
        "kv_cache_free_gpu_mem_fraction": str(engine.kv_cache_free_gpu_mem_fraction),
        "enable_kv_cache_reuse": flag(engine.enable_kv_cache_reuse),
        "enable_chunked_context": flag(engine.enable_chunked_context),
        # the bridge asks for new tokens only and echoes the input itself (python_llm's rule)
        "exclude_input_in_output": "true",
        "normalize_log_probs": "true",  # log-probabilities, as python_llm's
        "executor_worker_path": EXECUTOR_WORKER,  # orchestrator mode's worker
    }


def dynamic_batching_block(max_batch_size: int, max_queue_size: int) -> str:
    """The template's `dynamic_batching`: the backend reads the queue bound from
    `default_queue_policy.max_queue_size`; 0 (unbounded here) leaves it out."""
    policy = f"\n  default_queue_policy: {{ max_queue_size: {max_queue_size} }}" if max_queue_size > 0 else ""
    return (
        f"dynamic_batching {{\n  preferred_batch_size: [ {max_batch_size} ]\n"
        f"  max_queue_delay_microseconds: 0{policy}\n}}"
    )


def tensor_line(tensor: EngineTensor) -> str:
    dims = ", ".join(str(d) for d in tensor.dims)
    parts = [f'name: "{tensor.name}"', f"data_type: {tensor.data_type}", f"dims: [ {dims} ]"]
    if tensor.reshape_scalar:
        parts.append("reshape: { shape: [ ] }")
    if tensor.optional:
        parts.append("optional: true")
    if tensor.ragged:
        parts.append("allow_ragged_batch: true")
    return "  { " + " ".join(parts) + " }"
