"""The deployment settings as the containers read them: `LLM__SECTION__FIELD`
(`LLM__SECTION__GROUP__FIELD` in a group) environment variables
(serving/settings.py's own format), one ConfigMap that every Triton and
gateway container loads. Only values that differ from a
field's default are written (plus `engine.model_dir`, which has none), so the
manifests show what this deployment changed; `DeploymentSettings.load` on the
result gives back the same settings (tests/unit/deploy checks the round trip).

`for_cluster` fills in what the cluster decides, for settings left at their
defaults: the Triton replicas' DNS name, the in-cluster Redis, the gateway's
ops port on the pod IP (for Prometheus, not in the public Service), the key files
mounted from Secrets, the golden answer, the thread count from the CPU limit,
CUDA on the gpu profile."""

from __future__ import annotations

import json
from typing import Any

from pydantic import TypeAdapter

from layered_settings import ENV_PREFIX, field_types, is_group

from ..default_model import DEFAULT_MODEL_NAME
from ..settings import SECTIONS, DeploymentSettings
from .names import Names
from .profile import BUILD_DIR, CACHE_DIR, K8sProfile

DEFAULT_MODEL_DIR = f"{CACHE_DIR}/models/{DEFAULT_MODEL_NAME}"
# the golden answer the images record at build for the default model (docker/*.Dockerfile)
IMAGE_GOLDEN = f"{BUILD_DIR}/probe/{DEFAULT_MODEL_NAME}.json"
GOLDEN_MOUNT = "/etc/triton-llm/probe/golden.json"
GATEWAY_SECRET_DIR = "/etc/triton-llm/gateway"
KEYS_FILE = f"{GATEWAY_SECRET_DIR}/keys.json"
ADMIN_KEY_FILE = f"{GATEWAY_SECRET_DIR}/admin_key"
TRITON_HTTP_PORT = 8000
DEFAULT_GRPC_PORT = 8001
REDIS_PORT = 6379
OPS_HOST_IN_POD = "0.0.0.0"


def _dump(section: Any) -> dict[str, Any]:
    return TypeAdapter(type(section)).dump_python(section, mode="json")


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def settings_env(settings: DeploymentSettings) -> dict[str, str]:
    """LLM__SECTION__FIELD (LLM__SECTION__GROUP__FIELD in a group) -> value for
    every field that differs from its default."""
    env: dict[str, str] = {}
    for section in SECTIONS:
        current = _dump(getattr(settings, section))
        if section == "engine":
            default = _dump(type(settings.engine)(model_dir=settings.engine.model_dir))
        else:
            default = _dump(SECTIONS[section]())
        defaults = dict(_leaves(SECTIONS[section], default, (section,)))
        for path, value in _leaves(SECTIONS[section], current, (section,)):
            if (value != defaults[path] or path == ("engine", "model_dir")) and value is not None:
                env[ENV_PREFIX + "__".join(p.upper() for p in path)] = _text(value)
    return env


def _leaves(kind: Any, dumped: dict[str, Any], path: tuple[str, ...]) -> list[tuple[tuple[str, ...], Any]]:
    """Each setting's path and value, a group's settings one by one."""
    leaves: list[tuple[tuple[str, ...], Any]] = []
    for name, hint in field_types(kind).items():
        if is_group(hint):
            leaves += _leaves(hint, dumped[name], (*path, name))
        else:
            leaves.append(((*path, name), dumped[name]))
    return leaves


def grpc_port(settings: DeploymentSettings) -> int:
    """Triton's gRPC port: the one the gateway's discovery name carries."""
    _, _, port = settings.gateway.fleet.discovery_dns.rpartition(":")
    return int(port) if port.isdigit() else DEFAULT_GRPC_PORT


def for_cluster(
    settings: DeploymentSettings, profile: K8sProfile, names: Names, golden_mounted: bool
) -> DeploymentSettings:
    """The settings with what the cluster decides filled in where they were left at their defaults."""
    g, e = settings.gateway, settings.engine
    defaults = SECTIONS["gateway"]()
    changes: dict[str, Any] = {}
    if not g.fleet.discovery_dns:
        changes["gateway.fleet.discovery_dns"] = (
            f"{names.triton}.{profile.namespace}.svc.cluster.local:{DEFAULT_GRPC_PORT}"
        )
    if not g.redis_url and profile.redis:
        changes["gateway.redis_url"] = f"redis://{names.redis}.{profile.namespace}.svc.cluster.local:{REDIS_PORT}/0"
    if not g.keys_file:
        changes["gateway.keys_file"] = KEYS_FILE
    if not g.admin_key_file:
        changes["gateway.admin_key_file"] = ADMIN_KEY_FILE
    if golden_mounted:
        changes["gateway.fleet.probe_golden_file"] = GOLDEN_MOUNT
    elif not g.fleet.probe_golden_file and e.model_dir == DEFAULT_MODEL_DIR:
        changes["gateway.fleet.probe_golden_file"] = IMAGE_GOLDEN
    if g.ops_port and g.ops_host == defaults.ops_host:
        # the pod IP, for Prometheus; the public Service keeps to the API ports (gateway.py)
        changes["gateway.ops_host"] = OPS_HOST_IN_POD
    if g.host != defaults.host:
        raise ValueError(f"gateway.host: {g.host!r}; in a pod the gateway must listen on {defaults.host!r}")
    if e.num_threads <= 0:
        changes["engine.num_threads"] = profile.triton_cpu
    if profile.gpus and e.device == "cpu":
        changes["engine.device"] = "cuda"
    return settings.replace(**changes) if changes else settings


__all__ = [
    "ADMIN_KEY_FILE",
    "DEFAULT_MODEL_DIR",
    "GOLDEN_MOUNT",
    "IMAGE_GOLDEN",
    "KEYS_FILE",
    "OPS_HOST_IN_POD",
    "TRITON_HTTP_PORT",
    "for_cluster",
    "grpc_port",
    "settings_env",
]
