"""The rendered `tensorrt_llm_engine` model against TensorRT-LLM's own template
at the pinned release: every parameter name, and every tensor with its type,
dims and flags, appears in the list vendored from
triton-inference-server/tensorrtllm_backend v0.14.0
all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt
(tests/data/trtllm/tensorrt_llm_config_v0.14.0.json; no network here)."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serving.repository import render_repository
from serving.settings import DeploymentSettings
from serving.trtllm import versions
from serving.trtllm.engine_config import ENGINE_INPUTS, ENGINE_MODEL_NAME, ENGINE_OUTPUTS

REFERENCE = json.loads(
    (
        Path(__file__).parents[2] / "data" / "trtllm" / f"tensorrt_llm_config_v{versions.TENSORRT_LLM_VERSION}.json"
    ).read_text()
)
TEMPLATE_INPUTS = {t["name"]: t for t in REFERENCE["inputs"]}
TEMPLATE_OUTPUTS = {t["name"]: t for t in REFERENCE["outputs"]}


def _engine_config(tmp_path: Path, **overrides: object) -> model_config_pb2.ModelConfig:
    settings = DeploymentSettings.load(
        environ={}, model_dir="/models/m", **{"server.llm_model_name": "tensorrt_llm"}, **overrides
    )
    out = render_repository(settings, tmp_path / "repo")
    return text_format.Parse((out / ENGINE_MODEL_NAME / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def test_the_vendored_list_names_its_source_and_the_pin_matches_it():
    source = REFERENCE["source"]
    assert source["tag"] == versions.BACKEND_TAG == f"v{versions.TENSORRT_LLM_VERSION}"
    assert source["commit"] == versions.BACKEND_COMMIT
    assert source["path"] == versions.TEMPLATE_PATH
    assert source["repository"] == versions.BACKEND_REPOSITORY
    assert "24.10" in source["why_this_tag"] and "24.10" in versions.TRITON_CONTAINER


def test_every_parameter_name_is_in_tensorrt_llms_template(tmp_path: Path):
    config = _engine_config(tmp_path)
    assert config.backend == REFERENCE["backend"] == "tensorrtllm"
    names = set(config.parameters)
    assert names <= set(REFERENCE["parameters"]), names - set(REFERENCE["parameters"])
    # what the issue asks of the variant, by TensorRT-LLM's names
    assert config.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    assert {
        "enable_kv_cache_reuse",
        "enable_chunked_context",
        "kv_cache_free_gpu_mem_fraction",
        "gpt_model_path",
        "batch_scheduler_policy",
    } <= names


def test_every_tensor_is_declared_as_in_tensorrt_llms_template(tmp_path: Path):
    config = _engine_config(tmp_path)
    for tensor in config.input:
        reference = TEMPLATE_INPUTS[tensor.name]
        assert model_config_pb2.DataType.Name(tensor.data_type) == reference["data_type"], tensor.name
        assert list(tensor.dims) == reference["dims"], tensor.name
        assert tensor.optional == reference["optional"], tensor.name
        assert tensor.HasField("reshape") == ("reshape" in reference), tensor.name
        if tensor.HasField("reshape"):
            assert list(tensor.reshape.shape) == reference["reshape"]
        assert tensor.allow_ragged_batch == reference.get("allow_ragged_batch", False), tensor.name
    for tensor in config.output:
        reference = TEMPLATE_OUTPUTS[tensor.name]
        assert (model_config_pb2.DataType.Name(tensor.data_type), list(tensor.dims)) == (
            reference["data_type"],
            reference["dims"],
        ), tensor.name
    # every input the template requires is declared (and sent: test_trtllm_bridge.py)
    required = {name for name, t in TEMPLATE_INPUTS.items() if not t["optional"]}
    assert required <= {t.name for t in config.input}
    assert [t.name for t in ENGINE_INPUTS] == [t.name for t in config.input]
    assert [t.name for t in ENGINE_OUTPUTS] == [t.name for t in config.output]


def test_decoupled_in_flight_batching_with_the_queue_bound_from_the_settings(tmp_path: Path):
    config = _engine_config(
        tmp_path,
        **{
            "engine.max_queue_size": 33,
            "engine.kv_cache_free_gpu_mem_fraction": 0.8,
            "engine.enable_kv_cache_reuse": False,
            "server.max_batch_size": 16,
        },
    )
    assert config.model_transaction_policy.decoupled
    assert config.max_batch_size == 16
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 33
    assert list(config.dynamic_batching.preferred_batch_size) == [16]
    params = {k: v.string_value for k, v in config.parameters.items()}
    assert params["kv_cache_free_gpu_mem_fraction"] == "0.8" and params["enable_kv_cache_reuse"] == "false"
    assert params["enable_chunked_context"] == "true"
    assert params["gpt_model_path"] == "/models/m/tensorrt_llm_engine"
    # the template's KIND_CPU: the backend places the ranks on GPUs itself
    assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]
    # unbounded (0): no queue policy, TensorRT-LLM's executor gets none
    unbounded = _engine_config(tmp_path / "u", **{"engine.max_queue_size": 0})
    assert not unbounded.dynamic_batching.HasField("default_queue_policy")


def test_the_engine_folder_can_be_given_at_render(tmp_path: Path):
    settings = DeploymentSettings.load(environ={}, model_dir="/models/m", **{"server.llm_model_name": "tensorrt_llm"})
    out = render_repository(settings, tmp_path / "repo", trtllm_engine_dir="/engines/tp2pp1")
    assert (
        'key: "gpt_model_path" value: { string_value: "/engines/tp2pp1" }'
        in (out / ENGINE_MODEL_NAME / "config.pbtxt").read_text()
    )
