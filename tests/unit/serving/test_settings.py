"""The deployment settings: one model composing the engine's, the text
stages' and the server's own settings, read from a TOML file, the environment
and `--set`, and rendered into the model repository, where every value reaches
the part that uses it."""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path

import pytest

from ensemble.stage_settings import TextStageConfig, TextStageSettings
from gateway.config import (
    DegradationConfig,
    FleetConfig,
    GatewayConfig,
    LimitsConfig,
    ReplicaConfig,
    StreamsConfig,
    TierConfig,
)
from layered_settings import field_types, is_group, setting_names
from python_llm.config_params import engine_config_from_parameters
from python_llm.engine.config import EngineConfig
from serving.paths import REPO_ROOT
from serving.repository import render_repository
from serving.settings import (
    SECTIONS,
    DeploymentSettings,
    ServerConfig,
    SettingsError,
    load_section,
)

# a valid value other than the default for every engine setting: a new
# setting fails test_every_field_has_a_test_value until it is listed here
ENGINE_VALUES = {
    "model_dir": "/models/other",
    "device": "cuda:1",
    "dtype": "bfloat16",
    "block_size": 32,
    "max_tokens_in_paged_kv_cache": 4096,
    "kv_cache_free_gpu_mem_fraction": 0.5,
    "max_num_seqs": 8,
    "max_num_batched_tokens": 256,
    "max_queue_size": 9,
    "max_model_len": 2048,
    "max_tokens_limit": 1000,
    "default_max_tokens": 77,
    "default_token_timeout_ms": 1500,
    "enable_kv_cache_reuse": False,
    "enable_chunked_context": False,
    "num_threads": 3,
    "attention_backend": "torch",
    "linear_backend": "torch",
    "greedy_lm_head": "fp32",
    "debug_step_delay_ms": 5,
    "debug_fail_after_steps": 11,
    "exit_on_engine_failure_s": -1.0,
    "prefill_time_ratio": 0.75,
    "stream_response_share": 0.3,
    "stream_max_hold_ms": 120,
}
TEXT_VALUES = {
    "default_system_prompt": 'Be "brief", \\ kind.',
    "max_messages": 10,
    "max_messages_depth": 4,
    "max_text_input_bytes": 5000,
    "max_messages_bytes": 20000,
    "content_filter_rules": "/etc/rules.json",
}
SERVER_VALUES = {
    "max_batch_size": 8,
    "llm_model_name": "tensorrt_llm",
    "preprocessing_instances": 2,
    "postprocessing_instances": 3,
    "bls_max_concurrent_requests": 5,
    "allocator": "system",
    "exit_timeout_s": 7,
    "restart_replicas": False,
    "restart_backoff_s": 0.5,
    "restart_backoff_max_s": 9.0,
    "restart_reset_after_s": 20.0,
    "supervisor_metrics_port": 0,
}
GATEWAY_VALUES = {
    "host": "127.0.0.2",
    "port": 9100,
    "public_grpc_port": 9101,
    "keys_file": "/etc/keys.json",
    "redis_url": "redis://127.0.0.1:6390/0",
    "ops_host": "127.0.0.3",
    "ops_port": 9103,
    "drain_timeout_s": 12.0,
    "admin_key_file": "/etc/gateway_admin_key",
    # a structured field: a TOML table in a file, JSON in the environment and --set
    "tiers": {
        "gold": TierConfig(
            requests_per_second=1.5,
            tokens_per_second=300.0,
            priority=4,
            max_tokens_cap=64,
            max_concurrent_requests=3,
            allowed_models=("llm_bls",),
            stream_grace_s=3.0,
            spill_over="never",
        )
    },
    # groups: a TOML table each ([gateway.limits]), field by field in the environment and --set
    "limits": LimitsConfig(max_body_bytes=2048, max_json_depth=6, max_n=2, max_concurrent_requests=7),
    "fleet": FleetConfig(
        upstream_grpc_url="10.0.0.5:8001",
        replicas={
            "a": ReplicaConfig(
                grpc_url="10.0.0.7:8001", metrics_url="http://10.0.0.7:8002/metrics", dedicated_to=("gold",)
            )
        },
        routing_policy="least_load",
        weight_queue=1.5,
        weight_kv_cache=0.5,
        weight_prefix=4.0,
        weight_session=0.25,
        metrics_interval_s=0.25,
        metrics_stale_s=1.5,
        probe_interval_s=2.0,
        probe_timeout_s=4.0,
        probe_golden_file="/var/probe.json",
        eject_after_failures=2,
        readmit_after_successes=3,
        eject_backoff_s=1.0,
        failover_attempts=2,
        stall_timeout_s=4.5,
        migrate_attempts=1,
        discovery_dns="triton.llm.svc.cluster.local:8001",
        discovery_interval_s=2.0,
        discovery_metrics_port=9302,
    ),
    "streams": StreamsConfig(buffer_bytes=4096, keepalive_interval_s=2.5, response_retention_s=30.0),
    "degradation": DegradationConfig(
        max_level=3,
        window_s=30.0,
        enter_dwell_s=35.0,
        exit_dwell_s=40.0,
        queue_time_enter_s=8.0,
        queue_time_exit_s=1.5,
        kv_enter=0.95,
        kv_exit=0.6,
        preemptions_enter_per_s=2.0,
        preemptions_exit_per_s=0.05,
        error_rate_enter=0.3,
        error_rate_exit=0.01,
        max_tokens_cap=128,
        fallback_model="ensemble_small",
    ),
}
VALUES = {"engine": ENGINE_VALUES, "text": TEXT_VALUES, "server": SERVER_VALUES, "gateway": GATEWAY_VALUES}


def _plain(value: object) -> object:
    """Dataclasses and tuples as the dicts and lists a file or JSON holds."""
    if dataclasses.is_dataclass(value):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _toml(value: object) -> str:
    value = _plain(value)
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return str(value)


def _text(value: object) -> str:
    if isinstance(value, dict):
        return json.dumps(_plain(value))
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _is_group(value: object) -> bool:
    return dataclasses.is_dataclass(value) and not isinstance(value, type)


def _leaves(prefix: str, values: dict[str, object]) -> dict[str, object]:
    """`section.field` -> value, a group's fields as `section.group.field`."""
    leaves: dict[str, object] = {}
    for name, value in values.items():
        if _is_group(value):
            leaves.update(
                _leaves(f"{prefix}.{name}", {f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
            )  # type: ignore[arg-type]
        else:
            leaves[f"{prefix}.{name}"] = value
    return leaves


ALL_LEAVES = {k: v for s, vals in VALUES.items() for k, v in _leaves(s, vals).items()}


def _defaults(kind: type, prefix: str) -> dict[str, object]:
    """Each setting's default (None where it has none), a group's field by field."""
    defaults: dict[str, object] = {}
    for f in dataclasses.fields(kind):
        hint = field_types(kind)[f.name]
        if is_group(hint):
            defaults.update(_defaults(hint, f"{prefix}.{f.name}"))
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f"{prefix}.{f.name}"] = f.default_factory()
        else:
            defaults[f"{prefix}.{f.name}"] = None if f.default is dataclasses.MISSING else f.default
    return defaults


@pytest.mark.parametrize("section", list(SECTIONS))
def test_every_field_has_a_test_value(section):
    defaults, values = _defaults(SECTIONS[section], section), _leaves(section, VALUES[section])
    assert sorted(values) == sorted(defaults) == sorted(f"{section}.{n}" for n in setting_names(SECTIONS[section]))
    for name, value in values.items():  # each test value really differs from the default
        assert value != defaults[name], name


def _from_set() -> DeploymentSettings:
    return DeploymentSettings.load(environ={}, assignments=[f"{k}={_text(v)}" for k, v in ALL_LEAVES.items()])


def _from_file(tmp_path: Path) -> DeploymentSettings:
    """Groups as tables of their own (`[gateway.degradation]`)."""
    tables: dict[str, list[str]] = {}
    for name, value in ALL_LEAVES.items():
        table, _, key = name.rpartition(".")
        tables.setdefault(table, []).append(f"{key} = {_toml(value)}")
    path = tmp_path / "settings.toml"
    path.write_text("\n".join(f"[{table}]\n" + "\n".join(lines) for table, lines in tables.items()))
    return DeploymentSettings.load(settings_file=path, environ={})


def _from_environ() -> DeploymentSettings:
    return DeploymentSettings.load(
        environ={"LLM__" + k.upper().replace(".", "__"): _text(v) for k, v in ALL_LEAVES.items()}
    )


def _parameters(config_text: str) -> dict[str, str]:
    pairs = re.findall(r'parameters: \{ key: "([^"]+)" value: \{ string_value: "((?:[^"\\]|\\.)*)" \} \}', config_text)
    return {k: v.replace('\\"', '"').replace("\\\\", "\\") for k, v in pairs}


@pytest.mark.parametrize("source", ["set", "file", "environ"])
def test_every_setting_reaches_its_part_through_the_rendered_repository(source, tmp_path):
    settings = {"set": _from_set, "file": lambda: _from_file(tmp_path), "environ": _from_environ}[source]()
    assert settings.engine == EngineConfig(**ENGINE_VALUES)
    assert settings.text == TextStageConfig(**TEXT_VALUES) and settings.server == ServerConfig(**SERVER_VALUES)
    assert settings.gateway == GatewayConfig(**GATEWAY_VALUES)
    repo = render_repository(settings, tmp_path / "repo")

    # the engine, as the python_llm adapter builds it from its config
    llm_params = _parameters((repo / "python_llm" / "config.pbtxt").read_text())
    assert engine_config_from_parameters(llm_params) == settings.engine
    # the text stages, as their adapters read theirs
    for model in ("preprocessing", "postprocessing", "llm_bls"):
        stage = TextStageSettings.from_model_config(
            {
                "parameters": {
                    k: {"string_value": v} for k, v in _parameters((repo / model / "config.pbtxt").read_text()).items()
                }
            }
        )
        assert stage.config == settings.text, model
        assert stage.llm_model_name == "tensorrt_llm"
        assert stage.parameters["default_max_tokens"] == "77" and stage.parameters["max_tokens_limit"] == "1000"
        assert stage.parameters["max_model_len"] == "2048"
    bls = _parameters((repo / "llm_bls" / "config.pbtxt").read_text())
    assert bls["bls_max_concurrent_requests"] == "5"
    ensemble = (repo / "ensemble" / "config.pbtxt").read_text()
    assert 'model_name: "tensorrt_llm"' in ensemble and "max_batch_size: 8" in ensemble
    assert "count: 3" in (repo / "postprocessing" / "config.pbtxt").read_text()
    assert "count: 2" in (repo / "preprocessing" / "config.pbtxt").read_text()


def test_precedence_is_file_then_environment_then_set(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('[engine]\nmax_num_seqs = 4\nmax_queue_size = 5\ndtype = "float16"\n')
    settings = DeploymentSettings.load(
        settings_file=path,
        environ={"LLM__ENGINE__MAX_QUEUE_SIZE": "6", "LLM__ENGINE__DTYPE": "bfloat16"},
        assignments=["engine.dtype=float32"],
        model_dir="/m",
    )
    assert (settings.engine.max_num_seqs, settings.engine.max_queue_size, settings.engine.dtype) == (4, 6, "float32")


def test_the_default_model_is_prepared_only_when_no_source_names_one():
    calls = []
    settings = DeploymentSettings.load(environ={}, default_model_dir=lambda: calls.append(1) or "/default")
    assert settings.engine.model_dir == "/default" and calls == [1]
    settings = DeploymentSettings.load(
        environ={}, assignments=["engine.model_dir=/mine"], default_model_dir=lambda: calls.append(2) or "/default"
    )
    assert settings.engine.model_dir == "/mine" and calls == [1]
    with pytest.raises(SettingsError, match=r"^engine\.model_dir: required"):
        DeploymentSettings.load(environ={})


@pytest.mark.parametrize(
    "assignment,message",
    [
        ("engine.no_such=1", r"--set: engine\.no_such: no such setting; settings are engine\.\{model_dir,"),
        ("nosection.max_num_seqs=1", r"nosection\.max_num_seqs: no such setting"),
        ("max_num_seqs", r"expected SECTION\.FIELD=VALUE"),
        ("engine.max_num_seqs=many", r"^engine\.max_num_seqs: Input should be a valid integer"),
        ("engine.enable_kv_cache_reuse=maybe", r"^engine\.enable_kv_cache_reuse: Input should be a valid boolean"),
        ("engine.dtype=int8", r"dtype: unsupported 'int8'"),
        ("text.max_messages=0", r"max_messages: must be >= 1"),
    ],
)
def test_a_bad_setting_is_named_in_the_error(assignment, message):
    with pytest.raises(SettingsError, match=message):
        DeploymentSettings.load(environ={}, assignments=[assignment], model_dir="/m")


def test_a_bad_settings_file_is_named(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("[engin]\nmax_num_seqs = 4\n")
    with pytest.raises(SettingsError, match=r"\[engin\] is not a section"):
        DeploymentSettings.load(settings_file=path, environ={}, model_dir="/m")


def test_the_deployment_composes_each_parts_own_settings():
    types = {f.name: f.type for f in dataclasses.fields(DeploymentSettings)}
    assert types == {
        "engine": "EngineConfig",
        "text": "TextStageConfig",
        "server": "ServerConfig",
        "gateway": "GatewayConfig",
    }
    names = [f.name for section in SECTIONS.values() for f in dataclasses.fields(section)]
    assert len(names) == len(set(names)), "a field name in two sections"


# Where a default could hide: an annotated default (dataclass field or typed
# parameter) or a dict lookup with a fallback.
SHIPPED = ["backends", "ensemble", "serving", "gateway", "model_repository"]


def _default_sites(name: str) -> list[str]:
    patterns = [
        # a field or a parameter on its own line: its annotation may hold commas
        # inside brackets (dict[str, int]), but a comma outside ends the parameter
        re.compile(rf"^\s*{name}\s*:(?:[^=,\[\n]|\[[^\n]*?\])*=(?!=)", re.M),
        re.compile(rf"[(,]\s*{name}\s*:[^=,)\n]*=(?!=)"),
        re.compile(rf"""\.get\(\s*["']{name}["']\s*,"""),
    ]
    sites = []
    for folder in SHIPPED:
        for path in (REPO_ROOT / folder).rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            for pattern in patterns:
                sites += [
                    f"{path.relative_to(REPO_ROOT)}:{text.count(chr(10), 0, m.start()) + 1}"
                    for m in pattern.finditer(text)
                ]
    for template in (REPO_ROOT / "model_repository").rglob("config.pbtxt.template"):
        # a literal value, not a ${placeholder} filled from the settings
        if re.search(rf'key: "{name}" value: {{ string_value: "(?!\$\{{)', template.read_text()):
            sites.append(str(template.relative_to(REPO_ROOT)))
    return sorted(set(sites))


def _nested_setting_lines() -> set[str]:
    """Lines of the settings nested inside a section (a gateway tier), whose
    fields may share a section field's name: a tier's max_concurrent_requests
    is per key, the gateway's is for all keys together."""
    lines, start = inspect.getsourcelines(TierConfig)
    path = Path(inspect.getsourcefile(TierConfig)).relative_to(REPO_ROOT)
    return {f"{path}:{number}" for number in range(start, start + len(lines))}


def _setting_fields(kind: type, prefix: str) -> list[tuple[str, dataclasses.Field]]:
    """Every setting (a group's field by field, not the group) and its dataclass field."""
    found: list[tuple[str, dataclasses.Field]] = []
    for f in dataclasses.fields(kind):
        hint = field_types(kind)[f.name]
        found += _setting_fields(hint, f"{prefix}.{f.name}") if is_group(hint) else [(f"{prefix}.{f.name}", f)]
    return found


@pytest.mark.parametrize(
    "name,field",
    [pair for s, kind in SECTIONS.items() for pair in _setting_fields(kind, s)],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_each_default_is_defined_once(name, field):
    has_default = field.default is not dataclasses.MISSING or field.default_factory is not dataclasses.MISSING
    sites = [site for site in _default_sites(field.name) if site not in _nested_setting_lines()]
    assert len(sites) == int(has_default), f"{name}: defaults at {sites}"


def test_the_gateway_section_loads_alone_and_tiers_take_json():
    config = load_section(
        "gateway",
        environ={"LLM__GATEWAY__PORT": "9200"},
        assignments=['gateway.tiers={"t": {"priority": 2}}', "engine.max_num_seqs=3"],
    )
    assert config.port == 9200 and config.tiers == {"t": TierConfig(priority=2)}
    with pytest.raises(SettingsError, match=r"^--set: gateway\.tiers: not valid JSON"):
        load_section("gateway", environ={}, assignments=["gateway.tiers={bad"])


def test_a_group_loads_from_its_own_table_the_environment_and_set(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("[gateway.degradation]\nmax_level = 2\nwindow_s = 5.0\n\n[gateway.fleet]\nmigrate_attempts = 0\n")
    config = load_section(
        "gateway",
        settings_file=path,
        assignments=["gateway.degradation.window_s=7"],
        environ={"LLM__GATEWAY__DEGRADATION__ENTER_DWELL_S": "9", "LLM__GATEWAY__PORT": "9300"},
    )
    assert config.degradation == DegradationConfig(max_level=2, window_s=7.0, enter_dwell_s=9.0)
    assert config.fleet == FleetConfig(migrate_attempts=0) and config.port == 9300


@pytest.mark.parametrize(
    "assignment,message",
    [
        (
            "gateway.degradation.no_such=1",
            r"^--set: gateway\.degradation\.no_such: no such setting; settings are .*"
            r"gateway\.\{host,.*degradation\.max_level,",
        ),
        ("gateway.degradation.max_level=high", r"^gateway\.degradation\.max_level: Input should be a valid integer"),
        (
            "gateway.degradation=3",
            r"^--set: gateway\.degradation: a group of settings; set its fields: "
            r"gateway\.degradation\.max_level, ",
        ),
        ("gateway.port.x=1", r"^--set: gateway\.port\.x: no such setting"),
        ('gateway.fleet.replicas={"a": {"grpc_url": 5}}', r"^gateway\.fleet\.replicas\.a\.grpc_url: Input should be"),
    ],
)
def test_a_bad_nested_setting_is_named_by_its_full_path(assignment, message):
    with pytest.raises(SettingsError, match=message):
        load_section("gateway", environ={}, assignments=[assignment])


def test_a_bad_nested_table_or_variable_is_named_by_its_full_path(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text("[gateway.degradation]\nmax_levl = 2\n")
    with pytest.raises(SettingsError, match=r"settings file .*: gateway\.degradation\.max_levl: no such setting"):
        load_section("gateway", settings_file=path, environ={})
    with pytest.raises(SettingsError, match=r"^environment: gateway\.limits\.max_m: no such setting"):
        load_section("gateway", environ={"LLM__GATEWAY__LIMITS__MAX_M": "2"})
