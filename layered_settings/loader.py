"""Reading the layers into one table per section, and building each
section's dataclass from its table (pydantic checks and converts the types).

A setting's full name is `section.field`, `section.group.field` in a group:
`[section]` / `[section.group]` tables in the file, `LLM__` + the name with
`__` for dots in the environment (`LLM__GATEWAY__DEGRADATION__MAX_LEVEL`), the
name itself in `--set`. A structured field (a dict, list or tuple: the
gateway's `tiers`) takes JSON in the environment and in `--set`. Every error
names the setting by its full name and the source it came from."""

from __future__ import annotations

import json
import os
import tomllib
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .schema import field_types, is_group, setting_names

ENV_PREFIX = "LLM__"  # the stack's settings in the environment: LLM__SECTION__FIELD
Sections = Mapping[str, type]
Values = dict[str, dict[str, Any]]
_STRUCTURED = (dict, list, tuple)


class SettingsError(ValueError):
    """A setting that does not exist or does not parse; the message names it."""


def read_sources(
    sections: Sections,
    settings_file: str | Path | None = None,
    assignments: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
    skip_other_sections: bool = False,
) -> Values:
    """Each section's table from the file, the environment and `--set`, in that
    order of precedence. `skip_other_sections`: settings of sections not in
    `sections` are another program's (a shared settings file): ignored."""
    values: Values = {name: {} for name in sections}
    environ = os.environ if environ is None else environ
    layers: list[tuple[str, Mapping[str, Any]]] = []
    if settings_file is not None:
        layers.append(
            (f"settings file {settings_file}", _from_toml(Path(settings_file), sections, skip_other_sections))
        )
    layers.append(("environment", _from_environ(environ)))
    layers.append(("--set", dict(_parse_assignment(a) for a in assignments)))
    for source, flat in layers:
        if skip_other_sections:
            flat = {name: value for name, value in flat.items() if "." not in name or name.split(".")[0] in sections}
        merge(values, sections, flat, source)
    return values


def merge(values: Values, sections: Sections, flat: Mapping[str, Any], source: str) -> None:
    """`flat` (full name or a bare field name only one section has → value) into `values`."""
    for name, value in flat.items():
        try:
            path, kind = _resolve(sections, name)
            value = _structured_from_json(".".join(path), kind, value)
        except SettingsError as exc:
            raise SettingsError(f"{source}: {exc}") from None
        table = values[path[0]]
        for group in path[1:-1]:
            table = table.setdefault(group, {})
        table[path[-1]] = value


def build(section: str, kind: type, values: dict[str, Any]) -> Any:
    """The section's dataclass from its table; SettingsError names each setting that does not fit."""
    try:
        return TypeAdapter(kind).validate_python(values)
    except ValidationError as exc:
        problems = "; ".join(f"{section}.{'.'.join(str(p) for p in e['loc']) or '?'}: {e['msg']}" for e in exc.errors())
        raise SettingsError(problems) from None


def _resolve(sections: Sections, name: str) -> tuple[list[str], Any]:
    """`section.field` (`section.group.field` in a group), or a bare field
    name that only one section has: the path and the setting's type."""
    section, dot, rest = name.partition(".")
    if not dot:
        owners = [s for s in sections if name in field_types(sections[s])]
        if len(owners) != 1:
            raise SettingsError(f"{name}: {'ambiguous' if owners else 'no such setting'}; {_known(sections)}")
        section, rest = owners[0], name
    if section not in sections:
        raise SettingsError(f"{name}: no such setting; {_known(sections)}")
    path, kind = [section], sections[section]
    for part in rest.split("."):
        if not is_group(kind) or part not in field_types(kind):
            raise SettingsError(f"{name}: no such setting; {_known(sections)}")
        path.append(part)
        kind = field_types(kind)[part]
    if is_group(kind):
        raise SettingsError(
            f"{name}: a group of settings; set its fields: {', '.join(f'{name}.{n}' for n in setting_names(kind))}"
        )
    return path, kind


def _known(sections: Sections) -> str:
    return "settings are " + ", ".join(f"{s}.{{{','.join(setting_names(kind))}}}" for s, kind in sections.items())


def _parse_assignment(item: str) -> tuple[str, str]:
    name, sep, raw = item.partition("=")
    if not sep or not name:
        raise SettingsError(f"--set {item!r}: expected SECTION.FIELD=VALUE, e.g. engine.max_num_seqs=8")
    return name.strip(), raw


def _from_toml(path: Path, sections: Sections, skip_other_sections: bool) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SettingsError(f"settings file {path}: {exc}") from None
    flat: dict[str, Any] = {}
    for section, table in data.items():
        if section not in sections and skip_other_sections:
            continue
        if section not in sections or not isinstance(table, dict):
            raise SettingsError(
                f"settings file {path}: [{section}] is not a section; sections are {', '.join(sections)}"
            )
        flat.update(_flatten(section, sections[section], table))
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


def _structured_from_json(name: str, kind: Any, value: Any) -> Any:
    """A structured field given as text (environment, --set) is JSON."""
    if isinstance(value, str) and typing.get_origin(kind) in _STRUCTURED:
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise SettingsError(f"{name}: not valid JSON ({exc.msg})") from None
    return value
