"""What a section's dataclass declares: its settings, their types, and its
groups (a dataclass field, set field by field)."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeGuard


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
