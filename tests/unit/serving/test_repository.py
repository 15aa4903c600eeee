from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serving.repository import render_repository
from serving.settings import DeploymentSettings


def test_every_template_renders_with_no_placeholder_left(tmp_path: Path):
    settings = DeploymentSettings.load(
        environ={},
        model_dir="/models/x",
        max_queue_size=7,
        postprocessing_instances=3,
        enable_kv_cache_reuse=False,
        default_system_prompt='say "hi"',
    )
    out = render_repository(settings, tmp_path / "repo")
    configs = sorted(p.parent.name for p in out.glob("*/config.pbtxt"))
    assert configs == ["ensemble", "llm_bls", "postprocessing", "preprocessing", "python_llm"]
    assert not list(out.glob("*/config.pbtxt.template"))
    for config in out.glob("*/config.pbtxt"):
        assert "${" not in config.read_text(), config
    llm = (out / "python_llm" / "config.pbtxt").read_text()
    assert re.search(r'key: "max_queue_size" value: \{ string_value: "7" \}', llm)
    assert re.search(r'key: "enable_kv_cache_reuse" value: \{ string_value: "false" \}', llm)
    assert "count: 3" in (out / "postprocessing" / "config.pbtxt").read_text()
    assert 'say \\"hi\\"' in (out / "preprocessing" / "config.pbtxt").read_text()
    assert (out / "preprocessing" / "1" / "model.py").is_file()


def test_a_template_naming_an_unknown_setting_is_an_error(tmp_path: Path):
    source = tmp_path / "src"
    (source / "m").mkdir(parents=True)
    (source / "m" / "config.pbtxt.template").write_text('name: "m"\nx: ${no_such_setting}\n')
    with pytest.raises(ValueError, match="no_such_setting"):
        render_repository(DeploymentSettings.load(environ={}, model_dir="/m"), tmp_path / "out", source=source)


def _configs(root: Path) -> dict[str, model_config_pb2.ModelConfig]:
    return {
        path.parent.name: text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        for path in root.glob("*/config.pbtxt")
    }


def test_the_ensemble_wiring_connects_declared_tensors_of_one_type(tmp_path: Path):
    """Every step's input is an ensemble input or an earlier step's output of
    the type the step declares, and every mapped name exists in its model:
    what Triton checks when it loads the ensemble, here without a server."""
    configs = _configs(render_repository(DeploymentSettings.load(environ={}, model_dir="/m"), tmp_path / "repo"))
    ensemble = configs["ensemble"]
    available = {t.name: t.data_type for t in ensemble.input}
    for step in ensemble.ensemble_scheduling.step:
        model = configs[step.model_name]
        inputs = {t.name: t.data_type for t in model.input}
        outputs = {t.name: t.data_type for t in model.output}
        for key, value in step.input_map.items():
            assert key in inputs, (step.model_name, key)
            assert available.get(value) == inputs[key], (step.model_name, key, value)
        for key, value in step.output_map.items():
            assert key in outputs, (step.model_name, key)
            available[value] = outputs[key]
    for output in ensemble.output:
        assert available.get(output.name) == output.data_type, output.name


def test_continuation_ids_is_an_int32_list_input_counted_for_the_llm_step(tmp_path: Path):
    configs = _configs(render_repository(DeploymentSettings.load(environ={}, model_dir="/m"), tmp_path / "repo"))
    for model in ("ensemble", "llm_bls", "preprocessing"):
        (tensor,) = [t for t in configs[model].input if t.name == "continuation_ids"]
        assert (tensor.data_type, list(tensor.dims), tensor.optional) == (model_config_pb2.TYPE_INT32, [-1], True)
    steps = {s.model_name: s for s in configs["ensemble"].ensemble_scheduling.step}
    assert steps["preprocessing"].input_map["continuation_ids"] == "continuation_ids"
    wired = steps["preprocessing"].output_map["continuation_length"]
    assert steps["python_llm"].input_map["continuation_length"] == wired
    (llm_input,) = [t for t in configs["python_llm"].input if t.name == "continuation_length"]
    assert (llm_input.data_type, list(llm_input.dims), llm_input.optional) == (model_config_pb2.TYPE_INT32, [1], True)


VARIANTS = ("python_llm", "tensorrt_llm")


def _variant(tmp_path: Path, variant: str, **overrides: object) -> dict[str, model_config_pb2.ModelConfig]:
    settings = DeploymentSettings.load(environ={}, model_dir="/m", **{"server.llm_model_name": variant}, **overrides)
    return _configs(render_repository(settings, tmp_path / variant))


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_config_of_both_variants_parses_with_tritons_model_config(tmp_path: Path, variant: str):
    """Every config.pbtxt, parsed by Triton's own ModelConfig protobuf (text_format
    refuses unknown fields and malformed values), and the ensemble's wiring holds."""
    out = render_repository(
        DeploymentSettings.load(environ={}, model_dir="/m", **{"server.llm_model_name": variant}), tmp_path / "repo"
    )
    configs = _configs(out)
    expected = {"ensemble", "llm_bls", "postprocessing", "preprocessing", "python_llm"}
    if variant == "tensorrt_llm":
        expected |= {"tensorrt_llm", "tensorrt_llm_engine"}
    assert set(configs) == expected
    assert all(configs[name].name == name for name in configs)
    assert not list(out.glob("*/config.pbtxt.template"))
    steps = {s.model_name: s for s in configs["ensemble"].ensemble_scheduling.step}
    assert set(steps) == {"preprocessing", variant, "postprocessing"}
    available = {t.name: t.data_type for t in configs["ensemble"].input}
    for step in configs["ensemble"].ensemble_scheduling.step:
        model = configs[step.model_name]
        inputs = {t.name: t.data_type for t in model.input}
        outputs = {t.name: t.data_type for t in model.output}
        for key, value in step.input_map.items():
            assert key in inputs and available.get(value) == inputs[key], (step.model_name, key, value)
        for key, value in step.output_map.items():
            assert key in outputs, (step.model_name, key)
            available[value] = outputs[key]
    # the text stages call the variant's LLM step (requests and stops)
    for stage in ("preprocessing", "postprocessing", "llm_bls"):
        assert configs[stage].parameters["llm_model_name"].string_value == variant


def _tensors(config: model_config_pb2.ModelConfig) -> tuple[list[str], list[str]]:
    return (
        [text_format.MessageToString(t, as_one_line=True) for t in config.input],
        [text_format.MessageToString(t, as_one_line=True) for t in config.output],
    )


def test_the_public_tensors_and_the_llm_steps_tensors_are_the_same_in_both_variants(tmp_path: Path):
    python_llm, trtllm = _variant(tmp_path, "python_llm"), _variant(tmp_path, "tensorrt_llm")
    for model in ("ensemble", "llm_bls", "preprocessing", "postprocessing"):
        assert _tensors(python_llm[model]) == _tensors(trtllm[model]), model
        assert python_llm[model].max_batch_size == trtllm[model].max_batch_size
    # the LLM step the ensemble calls: python_llm's tensors, decoupled, under the variant's name
    assert _tensors(trtllm["tensorrt_llm"]) == _tensors(python_llm["python_llm"])
    assert trtllm["tensorrt_llm"].model_transaction_policy.decoupled
    assert trtllm["tensorrt_llm"].backend == "python"
    # the ensembles differ only in the LLM step's name
    step_names = [[s.model_name for s in c["ensemble"].ensemble_scheduling.step] for c in (python_llm, trtllm)]
    assert step_names == [
        ["preprocessing", "python_llm", "postprocessing"],
        ["preprocessing", "tensorrt_llm", "postprocessing"],
    ]
    for a, b in zip(python_llm["ensemble"].ensemble_scheduling.step, trtllm["ensemble"].ensemble_scheduling.step):
        assert (dict(a.input_map), dict(a.output_map)) == (dict(b.input_map), dict(b.output_map))


def test_the_thin_step_reads_the_engine_settings_like_python_llm(tmp_path: Path):
    from python_llm.config_params import engine_config_from_parameters

    settings = DeploymentSettings.load(
        environ={},
        model_dir="/m",
        **{
            "server.llm_model_name": "tensorrt_llm",
            "engine.default_token_timeout_ms": 1500,
            "engine.max_queue_size": 9,
            "engine.max_num_seqs": 3,
        },
    )
    configs = _configs(render_repository(settings, tmp_path / "repo"))
    params = {k: v.string_value for k, v in configs["tensorrt_llm"].parameters.items()}
    assert engine_config_from_parameters(params) == settings.engine
    assert params["engine_model_name"] == "tensorrt_llm_engine"
    assert params["max_live_requests"] == "12"  # TensorRT-LLM's 3 running + 9 queued


def test_an_unknown_llm_step_is_refused_naming_the_setting(tmp_path: Path):
    settings = DeploymentSettings.load(environ={}, model_dir="/m", **{"server.llm_model_name": "vllm"})
    with pytest.raises(ValueError, match=r"server\.llm_model_name: 'vllm'.*python_llm, tensorrt_llm"):
        render_repository(settings, tmp_path / "repo")
