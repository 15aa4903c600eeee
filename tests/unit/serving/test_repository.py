from __future__ import annotations

import re
from pathlib import Path

import pytest

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
