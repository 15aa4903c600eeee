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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ensemble.stage_settings import TextStageConfig
from gateway.config import GatewayConfig
from layered_settings import SettingsError, build, merge, read_sources
from python_llm.engine.config import EngineConfig

from .allocator import Allocator

__all__ = ["SECTIONS", "DeploymentSettings", "ServerConfig", "SettingsError", "load_section"]


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
        values = read_sources(SECTIONS, settings_file, assignments, environ)
        merge(values, SECTIONS, overrides, "override")
        if "model_dir" not in values["engine"] and default_model_dir is not None:
            values["engine"]["model_dir"] = default_model_dir()
        if "model_dir" not in values["engine"]:
            raise SettingsError("engine.model_dir: required (a local Hugging Face model folder)")
        return cls(**{name: build(name, SECTIONS[name], values[name]) for name in SECTIONS})

    def replace(self, **overrides: Any) -> DeploymentSettings:
        """A copy with some fields changed (names as in `load`)."""
        values = {name: dataclasses.asdict(getattr(self, name)) for name in SECTIONS}
        merge(values, SECTIONS, overrides, "override")
        return type(self)(**{name: build(name, SECTIONS[name], values[name]) for name in SECTIONS})


def load_section(
    section: str,
    settings_file: str | Path | None = None,
    assignments: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> Any:
    """One section alone, from the same sources as `DeploymentSettings.load`
    (the gateway runs without an engine, so without its required model folder);
    settings of other sections in those sources are checked and ignored."""
    values = read_sources(SECTIONS, settings_file, assignments, environ)
    return build(section, SECTIONS[section], values[section])
