"""Pieces every workload shares: object metadata, the non-root security
context, the settings ConfigMap as environment."""

from __future__ import annotations

from typing import Any

from .names import Names
from .profile import IMAGE_UID, K8sProfile


def meta(
    name: str, profile: K8sProfile, labels: dict[str, str], namespace: str | None = None, **extra: Any
) -> dict[str, Any]:
    return {"name": name, "namespace": namespace or profile.namespace, "labels": labels, **extra}


def pod_security() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_UID,
        "fsGroup": IMAGE_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security(read_only_root: bool) -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": read_only_root,
        "capabilities": {"drop": ["ALL"]},
    }


def settings_env_from(names: Names) -> list[dict[str, Any]]:
    return [{"configMapRef": {"name": names.settings}}]


def env(values: dict[str, str | int]) -> list[dict[str, str]]:
    return [{"name": k, "value": str(v)} for k, v in values.items()]


def http_probe(path: str, port: str, period_s: int, failures: int, timeout_s: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period_s,
        "timeoutSeconds": timeout_s,
        "failureThreshold": failures,
    }
