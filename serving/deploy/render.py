"""Every manifest of a deployment, from the settings and a profile, as
numbered files to `kubectl apply -f` in order:

    00-namespace.yaml          the namespace
    10-settings.yaml           the settings ConfigMap (LLM__* for every pod) [+ the golden answer]
    20-triton.yaml             Triton: headless Service, StatefulSet, PDB, HPA, NetworkPolicy
    30-gateway.yaml            gateway: Service (API ports), headless ops Service, Deployment, PDB, NetworkPolicy; Redis
    40-monitoring.yaml         ServiceMonitors, PrometheusRule, Grafana dashboard (prometheus-operator)
    41-prometheus-adapter.yaml the HPA's custom metric (prometheus-adapter's rules, its namespace)
    50-inference-pool.yaml     the InferencePool (only with inference_pool=true)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

from ..settings import DeploymentSettings
from . import gateway, inference_pool, monitoring, triton
from .names import names_for
from .profile import K8sProfile
from .settings_env import for_cluster, settings_env

Manifests = dict[str, list[dict[str, Any]]]


def _checksum(data: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


def render(settings: DeploymentSettings, profile: K8sProfile, golden: Path | None = None) -> Manifests:
    """File name -> objects. `golden`: a probe golden file to ship in a ConfigMap
    (another model than the images' default one); without it the gateway uses the
    images' own for the default model, or checks readiness only."""
    names = names_for(profile)
    settings = for_cluster(settings, profile, names, golden_mounted=golden is not None)
    env = settings_env(settings)
    settings_maps: list[dict[str, Any]] = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": names.settings, "namespace": profile.namespace, "labels": names.labels("settings")},
            "data": env,
        }
    ]
    if golden is not None:
        settings_maps.append(
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": names.golden, "namespace": profile.namespace, "labels": names.labels("settings")},
                "data": {"golden.json": golden.read_text(encoding="utf-8")},
            }
        )
    checksum = _checksum({**env, **({"golden": settings_maps[-1]["data"]["golden.json"]} if golden else {})})
    sidecar = inference_pool.sidecar(settings, profile, names, golden is not None) if profile.inference_pool else None
    triton_objects = [
        triton.service(settings, profile, names),
        triton.statefulset(settings, profile, names, checksum, sidecar),
        triton.disruption_budget(profile, names),
        triton.network_policy(settings, profile, names, settings.gateway.port if profile.inference_pool else None),
    ]
    if profile.autoscale:
        triton_objects.append(triton.autoscaler(profile, names))
    gateway_objects = [
        gateway.service(settings, profile, names),
        *gateway.ops_service(settings, profile, names),
        gateway.deployment(settings, profile, names, checksum, golden is not None),
        gateway.disruption_budget(profile, names),
        gateway.network_policy(settings, profile, names),
    ]
    if profile.redis and settings.gateway.redis_url.startswith(f"redis://{names.redis}."):
        gateway_objects += gateway.redis(
            profile, names, ("gateway", "triton") if profile.inference_pool else ("gateway",)
        )
    files: Manifests = {
        "00-namespace.yaml": [
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": profile.namespace, "labels": {"app.kubernetes.io/part-of": "triton-llm-stack"}},
            }
        ],
        "10-settings.yaml": settings_maps,
        "20-triton.yaml": triton_objects,
        "30-gateway.yaml": gateway_objects,
    }
    if profile.monitoring:
        files["40-monitoring.yaml"] = monitoring.objects(settings, profile, names)
    if profile.autoscale:
        files["41-prometheus-adapter.yaml"] = [monitoring.adapter_config(profile, names)]
    if profile.inference_pool:
        files["50-inference-pool.yaml"] = [inference_pool.inference_pool(settings, profile, names)]
    return files


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    # multi-line text (rules, dashboards, the adapter's config) as readable blocks
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: list[dict[str, Any]]) -> str:
    return yaml.dump_all(objects, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)


def write(manifests: Manifests, out: Path, header: str = "") -> list[Path]:
    """Write the files (and only them: stale numbered files from an earlier render go)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("[0-9][0-9]-*.yaml"):
        if old.name not in manifests:
            old.unlink()
    written = []
    for name, objects in manifests.items():
        path = out / name
        path.write_text(header + to_yaml(objects), encoding="utf-8")
        written.append(path)
    return written
