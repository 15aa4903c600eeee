"""The public tensors of `ensemble` and `llm_bls` (docs/interface.md), defined
once. The model repository's configs are rendered from these lists
(`serving/model_config_blocks.py`), and `llm_bls` maps the sampling inputs to
the LLM step with the same table the ensemble's wiring is rendered from."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton's TYPE_* name
    dims: tuple[int, ...] = (1,)
    llm_input: str | None = None  # the LLM step's input this public input feeds directly


PUBLIC_INPUTS: tuple[TensorSpec, ...] = (
    # required, but declared optional: Triton 2.51 answers an ensemble request
    # missing a required input with an empty 200; preprocessing gives the 400
    TensorSpec("text_input", "TYPE_STRING"),
    TensorSpec("messages", "TYPE_STRING"),
    TensorSpec("max_tokens", "TYPE_INT32"),
    TensorSpec("stream", "TYPE_BOOL", llm_input="streaming"),
    TensorSpec("stop_words", "TYPE_STRING", (-1,)),
    TensorSpec("bad_words", "TYPE_STRING", (-1,)),
    TensorSpec("end_id", "TYPE_INT32"),
    TensorSpec("pad_id", "TYPE_INT32"),
    TensorSpec("top_k", "TYPE_INT32", llm_input="runtime_top_k"),
    TensorSpec("top_p", "TYPE_FP32", llm_input="runtime_top_p"),
    TensorSpec("temperature", "TYPE_FP32", llm_input="temperature"),
    TensorSpec("repetition_penalty", "TYPE_FP32", llm_input="repetition_penalty"),
    TensorSpec("presence_penalty", "TYPE_FP32", llm_input="presence_penalty"),
    TensorSpec("frequency_penalty", "TYPE_FP32", llm_input="frequency_penalty"),
    TensorSpec("length_penalty", "TYPE_FP32", llm_input="len_penalty"),
    TensorSpec("min_tokens", "TYPE_INT32", llm_input="min_tokens"),
    TensorSpec("seed", "TYPE_UINT64", llm_input="seed"),
    TensorSpec("ignore_eos", "TYPE_BOOL", llm_input="ignore_eos"),
    TensorSpec("exclude_input_in_output", "TYPE_BOOL", llm_input="exclude_input_in_output"),
    TensorSpec("priority", "TYPE_INT32", llm_input="priority"),
    TensorSpec("token_timeout_ms", "TYPE_INT32", llm_input="token_timeout_ms"),
    TensorSpec("segment", "TYPE_STRING"),
    # the caller's secret for `stop` (request_key.py); preprocessing adopts or mints it
    TensorSpec("request_key", "TYPE_STRING"),
    TensorSpec("return_log_probs", "TYPE_BOOL", llm_input="return_log_probs"),
    TensorSpec("return_num_input_tokens", "TYPE_BOOL"),
    TensorSpec("return_num_output_tokens", "TYPE_BOOL"),
    TensorSpec("return_perf_metrics", "TYPE_BOOL"),
    TensorSpec("return_output_ids", "TYPE_BOOL"),
    # output ids a previous replica already generated for this request (a
    # migrated stream): preprocessing appends them to the prompt and tells the
    # LLM step how many trailing ids they are (`continuation_length`)
    TensorSpec("continuation_ids", "TYPE_INT32", (-1,)),
)

PUBLIC_OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("text_output", "TYPE_STRING", (-1,)),
    TensorSpec("finish_reason", "TYPE_STRING", (-1,)),
    TensorSpec("request_key", "TYPE_STRING", (-1,)),
    TensorSpec("num_input_tokens", "TYPE_INT32"),
    TensorSpec("num_output_tokens", "TYPE_INT32"),
    TensorSpec("cum_log_probs", "TYPE_FP32", (-1,)),
    TensorSpec("output_log_probs", "TYPE_FP32", (-1, -1)),
    TensorSpec("output_ids", "TYPE_INT32", (-1,)),
    TensorSpec("arrival_time_ns", "TYPE_INT64"),
    TensorSpec("first_token_time_ns", "TYPE_INT64"),
    TensorSpec("last_token_time_ns", "TYPE_INT64"),
)

# public input name -> the LLM step's input name, for the inputs that go straight through
PUBLIC_TO_LLM: dict[str, str] = {t.name: t.llm_input for t in PUBLIC_INPUTS if t.llm_input is not None}

# Triton 2.51's ensemble validator keys tensors by name, so an ensemble input
# and output of one name are one tensor: the outputs then mix the request's own
# input with the decoupled LLM step's lineage, and the ensemble does not load
# ("receives inputs originated from different decoupled models", core
# src/ensemble_scheduler/ensemble_utils.cc). `ensemble` echoes the key under
# another name; `llm_bls`, a Python model, keeps the contract's name.
ENSEMBLE_OUTPUT_NAMES: dict[str, str] = {"request_key": "request_key_out"}


def ensemble_output_name(name: str) -> str:
    return ENSEMBLE_OUTPUT_NAMES.get(name, name)


# public outputs that `postprocessing` also takes as inputs (from the LLM step):
# its outputs of these names carry this suffix, and the ensemble maps them back
POSTPROCESSING_RENAMED = frozenset(
    {
        "finish_reason",
        "num_input_tokens",
        "cum_log_probs",
        "output_log_probs",
        "output_ids",
        "arrival_time_ns",
        "first_token_time_ns",
        "last_token_time_ns",
    }
)


def postprocessing_output_name(name: str) -> str:
    return f"{name}_out" if name in POSTPROCESSING_RENAMED else name
