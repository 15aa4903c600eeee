"""The gateway's settings when it runs on its own (`python -m gateway serve`,
`python -m gateway keys`): the `gateway` section of the deployment settings,
from the sources the launcher reads them from (serving/settings.py), in
rising precedence: the defaults, a TOML settings file's `[gateway]` table,
`LLM__GATEWAY__*` environment variables, `--set gateway.FIELD=VALUE`. A group
of settings (a dataclass field) is set field by field (`[gateway.GROUP]`,
`LLM__GATEWAY__GROUP__FIELD`, `gateway.GROUP.FIELD`); a structured field
(`tiers`, `replicas`) takes JSON in the environment and in `--set`.

The gateway reads them itself, not through the launcher's code: it runs
alone too (the images' `gateway` role, `tests/`), and depends on nothing of
the launcher's. Other sections' settings in the same sources are the
launcher's: ignored here."""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from ..config import GatewayConfig

SECTION = "gateway"
ENV_PREFIX = "LLM__GATEWAY__"
_STRUCTURED = (dict, list, tuple)


class SettingsError(ValueError):
    """A setting that does not exist or does not parse; the message names it."""


def load_config(
    settings_file: str | Path | None = None, assignments: Iterable[str] = (), environ: Mapping[str, str] | None = None
) -> GatewayConfig:
    values: dict[str, Any] = {}
    if settings_file is not None:
        source = f"settings file {settings_file}"
        for name, value in _from_toml(Path(settings_file)).items():
            _put(values, name, value, source)
    for key, value in (os.environ if environ is None else environ).items():
        if key.startswith(ENV_PREFIX):
            _put(values, key[len(ENV_PREFIX) :].lower().replace("__", "."), value, "environment")
    for item in assignments:
        name, sep, raw = item.partition("=")
        section, dot, field_name = name.strip().partition(".")
        if not sep or not dot:
            raise SettingsError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. gateway.port=9100")
        if section == SECTION:
            _put(values, field_name, raw, "--set")
    try:
        return TypeAdapter(GatewayConfig).validate_python(values)
    except ValidationError as exc:
        raise SettingsError(
            "; ".join(f"{SECTION}.{'.'.join(str(p) for p in e['loc']) or '?'}: {e['msg']}" for e in exc.errors())
        ) from None


def _fields(kind: Any) -> dict[str, Any]:
    """A settings dataclass's fields and their types; {} for a single setting."""
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        return {}
    hints = typing.get_type_hints(kind)
    return {f.name: hints[f.name] for f in dataclasses.fields(kind)}


def _names(kind: Any, prefix: str = "") -> list[str]:
    return [
        name
        for field_name, hint in _fields(kind).items()
        for name in (_names(hint, f"{prefix}{field_name}.") if _fields(hint) else [f"{prefix}{field_name}"])
    ]


def _put(values: dict[str, Any], name: str, value: Any, source: str) -> None:
    """`value` at the dotted `name` of the gateway section, checked against its fields."""
    table, kind = values, typing.cast(Any, GatewayConfig)
    parts = name.split(".")
    for position, part in enumerate(parts):
        fields = _fields(kind)
        if part not in fields:
            raise SettingsError(
                f"{source}: {SECTION}.{name}: no such setting; gateway settings are {', '.join(_names(GatewayConfig))}"
            )
        kind = fields[part]
        if position < len(parts) - 1:
            table = table.setdefault(part, {})
    if _fields(kind):
        raise SettingsError(
            f"{source}: {SECTION}.{name}: a group of settings; set its fields: "
            f"{', '.join(f'{SECTION}.{name}.{n}' for n in _names(kind))}"
        )
    if isinstance(value, str) and typing.get_origin(kind) in _STRUCTURED:
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{SECTION}.{name}: not valid JSON ({exc.msg})") from None
    table[parts[-1]] = value


def _from_toml(path: Path) -> dict[str, Any]:
    """The `[gateway]` table as dotted name → value (a group's own table, `[gateway.GROUP]`, flattened)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"settings file {path}: {exc}") from None
    table = data.get(SECTION, {})
    if not isinstance(table, dict):
        raise SettingsError(f"settings file {path}: [{SECTION}] is not a table")
    return _flatten(GatewayConfig, table)


def _flatten(kind: Any, table: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in table.items():
        hint = _fields(kind).get(key)
        if _fields(hint) and isinstance(value, dict):
            flat.update(_flatten(hint, value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat
