from __future__ import annotations

import re
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serving.repository import render_repository
from serving.settings import DeploymentSettings


def test_every_template_renders_with_no_placeholder_left(tmp_path: Path):
    settings = DeploymentSettings.load(environ={}, model_dir="/models/x", max_queue_size=7, postprocessing_instances=3,
                                       enable_kv_cache_reuse=False, default_system_prompt='say "hi"')
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
    return {path.parent.name: text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
            for path in root.glob("*/config.pbtxt")}


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
