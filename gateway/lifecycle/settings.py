"""The gateway's settings when it runs on its own (`python -m gateway serve`,
`python -m gateway keys`): the `gateway` section of the deployment settings,
read by the stack's one settings reader (layered_settings/) from the same
sources as the launcher's (serving/settings.py): the defaults, a TOML settings
file's `[gateway]` tables, `LLM__GATEWAY__*` environment variables,
`--set gateway.FIELD=VALUE`. Other sections' settings in those sources are
the launcher's: ignored here, so the gateway depends on nothing of it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from layered_settings import build, read_sources

from ..config import GatewayConfig

SECTIONS = {"gateway": GatewayConfig}


def load_config(
    settings_file: str | Path | None = None, assignments: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    values = read_sources(SECTIONS, settings_file, assignments, environ, skip_other_sections=True)
    config: GatewayConfig = build("gateway", GatewayConfig, values["gateway"])
    return config
