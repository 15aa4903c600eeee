"""The optional InferencePool (Gateway API Inference Extension): its model
servers must speak the OpenAI API, so each Triton pod gets a gateway sidecar
in front of its own Triton (keys, limits and validation as everywhere; its
upstream is 127.0.0.1), and the pool selects the Triton pods on the sidecar's
port. The endpoint picker it names (`profile.epp_service`) is deployed by the
operator, configured to read the engine's queue (`llm_num_requests_waiting`)
from each pod's metrics port."""

from __future__ import annotations

import json
from typing import Any

from ..settings import DeploymentSettings
from .common import meta
from .gateway import gateway_container, gateway_volumes
from .names import Names
from .profile import K8sProfile
from .triton import ports


def sidecar(
    settings: DeploymentSettings, profile: K8sProfile, names: Names, golden: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    p = ports(settings)
    local = {"local": {"grpc_url": f"127.0.0.1:{p['grpc']}", "metrics_url": f"http://127.0.0.1:{p['metrics']}/metrics"}}
    # its ops port stays on the pod's loopback: Triton's NetworkPolicy admits no one to it
    overrides = {
        "LLM__GATEWAY__FLEET__DISCOVERY_DNS": "",
        "LLM__GATEWAY__PUBLIC_GRPC_PORT": "0",
        "LLM__GATEWAY__OPS_HOST": "127.0.0.1",
        "LLM__GATEWAY__FLEET__REPLICAS": json.dumps(local, separators=(",", ":")),
    }
    container = gateway_container(
        settings.replace(**{"gateway.public_grpc_port": 0, "gateway.ops_host": "127.0.0.1"}),
        profile,
        names,
        name="openai",
        overrides=overrides,
        golden=golden,
    )
    return container, gateway_volumes(names, golden)


def inference_pool(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": meta(profile.app, profile, names.labels("triton")),
        "spec": {
            "selector": {"matchLabels": names.selector("triton")},
            "targetPorts": [{"number": settings.gateway.port}],
            "endpointPickerRef": {
                "name": profile.epp_service,
                "kind": "Service",
                "port": {"number": profile.epp_port},
                "failureMode": "FailClose",
            },
        },
    }
