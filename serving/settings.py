"""The deployment's settings: one model composing each part's own settings.

Every field is defined once, with its default, by the part that uses it:
`engine` is the engine's `EngineConfig`, `text` the text stages'
`TextStageConfig`, `server` the repository-wide values below, `gateway` the
gateway's `GatewayConfig`. This module only composes them and reads them, in
rising precedence, from their defaults, a TOML settings file (`[engine]`,
`[text]`, `[server]`, `[gateway]` tables), the environment
(`LLM__ENGINE__MAX_NUM_SEQS=8`) and `--set section.field=value`; a structured
field (the gateway's `tiers`) takes JSON in the environment and in `--set`.
A section may nest groups of settings (a dataclass field: the gateway's
`degradation`), read as a table of its own (`[gateway.degradation]`),
`LLM__GATEWAY__DEGRADATION__MAX_LEVEL=2` and `--set gateway.degradation.max_level=2`;
errors name a setting by that full path. `python -m serving settings` prints
them all (serving/settings_reference.py).
The model repository's configs are rendered from the result
(`serving/repository.py`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

from pydantic import TypeAdapter, ValidationError

from ensemble.stage_settings import TextStageConfig
from gateway.config import GatewayConfig
from python_llm.engine.config import EngineConfig

from .allocator import Allocator

ENV_PREFIX = "LLM__"


class SettingsError(ValueError):
    """A setting that does not exist or does not parse; the message names it."""


@dataclass
class ServerConfig:
    max_batch_size: int = 64  # every model's max_batch_size (TensorRT-LLM's convention)
    # the LLM step the ensemble, llm_bls and the text stages call ("tensorrt_llm" in the GPU container)
    llm_model_name: str = "python_llm"
    preprocessing_instances: int = 1  # instances of the preprocessing stage (tokenizing)
    postprocessing_instances: int = 1  # instances of the postprocessing stage (detokenizing)
    # llm_bls serves each request on a thread of its own: the most at once
    bls_max_concurrent_requests: int = 256
    # tritonserver's malloc, preloaded into it and its stubs (serving/allocator.py)
    allocator: Allocator = "tcmalloc"
    # tritonserver's --exit-timeout-secs: at a stop, how long it waits for in-flight
    # inferences (Triton 2.51 leaks cancelled ensemble requests as in flight) before
    # unloading its models; the launcher kills it 5 s after that
    exit_timeout_s: int = 3
    # serve's supervision of its replicas (serving/supervisor.py): a replica that
    # exits is restarted after restart_backoff_s, doubled for each exit in a row up
    # to restart_backoff_max_s (with jitter); a run of restart_reset_after_s ends the row
    # False: serve exits as soon as a replica does (in a container, so the
    # orchestrator sees it, restarts it with its own backoff and counts it)
    restart_replicas: bool = True
    restart_backoff_s: float = 1.0  # the first restart's delay
    restart_backoff_max_s: float = 30.0  # the longest delay, however many exits in a row
    restart_reset_after_s: float = 60.0  # a replica that ran this long starts the next row afresh
    # serve's own Prometheus metrics (serving_replica_restarts_total ...) on
    # 127.0.0.1; 0: none
    supervisor_metrics_port: int = 8003


SECTIONS: dict[str, type] = {
    "engine": EngineConfig,
    "text": TextStageConfig,
    "server": ServerConfig,
    "gateway": GatewayConfig,
}


@dataclass
class DeploymentSettings:
    engine: EngineConfig
    text: TextStageConfig = field(default_factory=TextStageConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)

    @classmethod
    def load(
        cls,
        settings_file: str | Path | None = None,
        assignments: Iterable[str] = (),
        environ: Mapping[str, str] | None = None,
        default_model_dir: Callable[[], str] | None = None,
        **overrides: Any,
    ) -> DeploymentSettings:
        """Defaults < settings file < environment < `--set` assignments < keyword
        overrides (`section.field` or a field name unique across sections, as
        the tests use them). `default_model_dir` is called only when no source
        names `engine.model_dir` (preparing the default model takes a minute)."""
        values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
        if settings_file is not None:
            _merge(values, _from_toml(Path(settings_file)), f"settings file {settings_file}")
        _merge(values, _from_environ(os.environ if environ is None else environ), "environment")
        _merge(values, dict(_parse_assignment(a) for a in assignments), "--set")
        _merge(values, overrides, "override")
        if "model_dir" not in values["engine"] and default_model_dir is not None:
            values["engine"]["model_dir"] = default_model_dir()
        if "model_dir" not in values["engine"]:
            raise SettingsError("engine.model_dir: required (a local Hugging Face model folder)")
        return cls(**{name: _build(name, SECTIONS[name], values[name]) for name in SECTIONS})

    def replace(self, **overrides: Any) -> DeploymentSettings:
        """A copy with some fields changed (names as in `load`)."""
        values = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        _merge(values, overrides, "override")
        return type(self)(**{name: _build(name, SECTIONS[name], values[name]) for name in SECTIONS})


def load_section(
    section: str,
    settings_file: str | Path | None = None,
    assignments: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Any:
    """One section alone, from the same sources as `DeploymentSettings.load`
    (the gateway runs without an engine, so without its required model folder);
    settings of other sections in those sources are checked and ignored."""
    values: dict[str, dict[str, Any]] = {name: {} for name in SECTIONS}
    if settings_file is not None:
        _merge(values, _from_toml(Path(settings_file)), f"settings file {settings_file}")
    _merge(values, _from_environ(os.environ if environ is None else environ), "environment")
    _merge(values, dict(_parse_assignment(a) for a in assignments), "--set")
    return _build(section, SECTIONS[section], values[section])


def is_group(kind: Any) -> TypeGuard[type]:
    """A nested group of settings (`gateway.degradation`): a dataclass field,
    set field by field (`gateway.degradation.max_level`), never as a whole."""
    return isinstance(kind, type) and dataclasses.is_dataclass(kind)


def field_types(kind: type) -> dict[str, Any]:
    """A settings dataclass's fields and their types, in definition order."""
    hints = typing.get_type_hints(kind)
    return {f.name: hints[f.name] for f in dataclasses.fields(kind)}


def setting_names(kind: type, prefix: str = "") -> list[str]:
    """Every setting of a section or group, nested ones as `group.field`."""
    names: list[str] = []
    for name, hint in field_types(kind).items():
        names += setting_names(hint, f"{prefix}{name}.") if is_group(hint) else [f"{prefix}{name}"]
    return names


def _resolve(name: str) -> tuple[list[str], Any]:
    """`section.field` (`section.group.field` in a group), or a bare field
    name that only one section has: the path and the setting's type."""
    section, dot, rest = name.partition(".")
    if not dot:
        owners = [s for s in SECTIONS if name in field_types(SECTIONS[s])]
        if len(owners) != 1:
            raise SettingsError(f"{name}: {'ambiguous' if owners else 'no such setting'}; {_known()}")
        section, rest = owners[0], name
    if section not in SECTIONS:
        raise SettingsError(f"{name}: no such setting; {_known()}")
    path, kind = [section], SECTIONS[section]
    for part in rest.split("."):
        if not is_group(kind) or part not in field_types(kind):
            raise SettingsError(f"{name}: no such setting; {_known()}")
        path.append(part)
        kind = field_types(kind)[part]
    if is_group(kind):
        raise SettingsError(
            f"{name}: a group of settings; set its fields: {', '.join(f'{name}.{n}' for n in setting_names(kind))}"
        )
    return path, kind


def _known() -> str:
    return "settings are " + ", ".join(f"{s}.{{{','.join(setting_names(kind))}}}" for s, kind in SECTIONS.items())


def _merge(values: dict[str, dict[str, Any]], flat: Mapping[str, Any], source: str) -> None:
    for name, value in flat.items():
        try:
            path, kind = _resolve(name)
            value = _structured_from_json(".".join(path), kind, value)
        except SettingsError as exc:
            raise SettingsError(f"{source}: {exc}") from None
        table = values[path[0]]
        for group in path[1:-1]:
            table = table.setdefault(group, {})
        table[path[-1]] = value


def _parse_assignment(item: str) -> tuple[str, str]:
    name, sep, raw = item.partition("=")
    if not sep or not name:
        raise SettingsError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. engine.max_num_seqs=8")
    return name.strip(), raw


def _from_toml(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"settings file {path}: {exc}") from None
    flat: dict[str, Any] = {}
    for section, table in data.items():
        if section not in SECTIONS or not isinstance(table, dict):
            raise SettingsError(
                f"settings file {path}: [{section}] is not a section; sections are {', '.join(SECTIONS)}"
            )
        flat.update(_flatten(section, SECTIONS[section], table))
    return flat


def _flatten(prefix: str, kind: type, table: dict[str, Any]) -> dict[str, Any]:
    """A TOML table as `prefix.field` -> value, a group's table (`[gateway.degradation]`)
    as `prefix.group.field`; a structured field's table (`tiers`) stays one value."""
    flat: dict[str, Any] = {}
    for key, value in table.items():
        hint = field_types(kind).get(key)
        if is_group(hint) and isinstance(value, dict):
            flat.update(_flatten(f"{prefix}.{key}", hint, value))
        else:
            flat[f"{prefix}.{key}"] = value
    return flat


def _from_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """`LLM__SECTION__FIELD`, `LLM__SECTION__GROUP__FIELD` in a group."""
    return {
        key[len(ENV_PREFIX) :].lower().replace("__", "."): value
        for key, value in environ.items()
        if key.startswith(ENV_PREFIX)
    }


_STRUCTURED = (dict, list, tuple)


def _structured_from_json(name: str, kind: Any, value: Any) -> Any:
    """A structured field given as text (environment, --set) is JSON."""
    if isinstance(value, str) and typing.get_origin(kind) in _STRUCTURED:
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{name}: not valid JSON ({exc.msg})") from None
    return value


def _build(section: str, kind: type, values: dict[str, Any]) -> Any:
    try:
        return TypeAdapter(kind).validate_python(values)
    except ValidationError as exc:
        problems = "; ".join(f"{section}.{'.'.join(str(p) for p in e['loc']) or '?'}: {e['msg']}" for e in exc.errors())
        raise SettingsError(problems) from None
