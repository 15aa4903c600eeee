"""Settings in layers: dataclass sections read, in rising precedence, from
their defaults, a TOML file, the environment and `--set NAME=VALUE`.

One reader for every program of the stack: the launcher reads every section
(serving/settings.py), the gateway alone its own (gateway/lifecycle/settings.py).
It imports nothing of the project."""

from .loader import ENV_PREFIX, SettingsError, build, merge, read_sources
from .schema import field_types, is_group, setting_names

__all__ = ["ENV_PREFIX", "SettingsError", "build", "field_types", "is_group", "merge", "read_sources", "setting_names"]
