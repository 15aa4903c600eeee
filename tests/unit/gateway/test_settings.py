"""The gateway's own reading of its settings section (gateway/lifecycle/settings.py):
the same sources and the same result as the launcher's reading (serving/settings.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import GatewayConfig, TierConfig
from gateway.lifecycle.settings import load_config
from layered_settings import SettingsError
from serving.settings import load_section


def test_the_gateway_reads_its_section_from_file_environment_and_set_as_the_launcher_does(tmp_path: Path):
    settings = tmp_path / "settings.toml"
    settings.write_text(
        "[engine]\nmax_num_seqs = 2\n\n[gateway]\nport = 9300\nops_port = 9302\n\n[gateway.tiers.gold]\npriority = 5\n"
    )
    environ = {"LLM__GATEWAY__OPS_PORT": "9312", "LLM__ENGINE__DTYPE": "float32", "LLM__GATEWAY__HOST": "127.0.0.9"}
    assignments = ["gateway.port=9400", "engine.max_num_seqs=3"]
    config = load_config(settings, assignments, environ)
    assert (config.port, config.ops_port, config.host) == (9400, 9312, "127.0.0.9")
    assert config.tiers == {"gold": TierConfig(priority=5)}
    assert load_config(None, ['gateway.tiers={"t": {"priority": 2}}'], {}).tiers == {"t": TierConfig(priority=2)}
    assert config == load_section("gateway", settings, assignments, environ)
    assert load_config(None, [], {}) == GatewayConfig()


@pytest.mark.parametrize(
    "assignments, problem",
    [
        (["gateway.nope=1"], r"--set: gateway\.nope: no such setting"),
        (["gateway.tiers={bad"], r"gateway\.tiers: not valid JSON"),
        (["gateway.port=many"], r"gateway\.port: "),
        (["port"], r"expected SECTION\.FIELD=VALUE"),
    ],
)
def test_a_bad_setting_is_named(assignments: list[str], problem: str):
    with pytest.raises(SettingsError, match=problem):
        load_config(None, assignments, {})
