"""The Triton replicas: a StatefulSet (each pod's own PVC holds the weights,
filled once by an init container, kept across restarts and scale-downs), the
headless Service the gateway discovers them through (ready pods only: the
readiness probe includes an inference check), a PodDisruptionBudget, the HPA
on the engine's queue, and the NetworkPolicy that lets only the gateway (and
Prometheus, for metrics) reach them."""

from __future__ import annotations

import math
from typing import Any

from ..settings import DeploymentSettings
from .common import container_security, env, http_probe, meta, pod_security, settings_env_from
from .names import Names
from .profile import APP_DIR, DATA_DIR, K8sProfile
from .settings_env import DEFAULT_MODEL_DIR, TRITON_HTTP_PORT, grpc_port

# the custom metric the HPA scales on (prometheus-adapter serves it: monitoring.adapter_rules)
QUEUE_METRIC = "llm_num_requests_waiting"
# CoreDNS caches a headless service's records this long (its default TTL)
DNS_TTL_S = 5
# `serving serve` gives tritonserver this long to stop after SIGTERM
TRITON_STOP_S = 30


def ports(settings: DeploymentSettings) -> dict[str, int]:
    return {
        "http": TRITON_HTTP_PORT,
        "grpc": grpc_port(settings),
        "metrics": settings.gateway.fleet.discovery_metrics_port,
    }


def drain_delay_s(settings: DeploymentSettings) -> int:
    """How long a stopping pod keeps answering new requests: until every gateway has
    re-resolved the name without it (its discovery interval, after the DNS cache)."""
    return math.ceil(settings.gateway.fleet.discovery_interval_s) + DNS_TTL_S


def termination_grace_s(settings: DeploymentSettings) -> int:
    """Longer than the longest reply: the drain delay, then in-flight replies get
    gateway.drain_timeout_s (the gateway's own bound on a reply while draining),
    then tritonserver's own stop."""
    return drain_delay_s(settings) + math.ceil(settings.gateway.drain_timeout_s) + TRITON_STOP_S


def service(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(names.triton, profile, names.labels("triton")),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": False,
            "selector": names.selector("triton"),
            "ports": [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in ports(settings).items()],
        },
    }


def _init_container(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> dict[str, Any]:
    """Fills the PVC: the default model converted from the image's packaged GGUF
    (once: a finished conversion is kept) and the probe's golden answer; another
    model must already be on the volume at engine.model_dir (this step checks it)."""
    args = ["prepare-model"]
    if settings.engine.model_dir != DEFAULT_MODEL_DIR:
        args += ["--model-dir", settings.engine.model_dir]
    return {
        "name": "prepare-model",
        "image": profile.image,
        "imagePullPolicy": profile.image_pull_policy,
        "args": args,
        "envFrom": settings_env_from(names),
        "resources": {
            "requests": {"cpu": "1", "memory": "4Gi"},
            "limits": {"cpu": str(profile.triton_cpu), "memory": profile.triton_memory},
        },
        "securityContext": container_security(read_only_root=False),
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}],
    }


def _resources(profile: K8sProfile) -> dict[str, Any]:
    limits: dict[str, str] = {"cpu": str(profile.triton_cpu), "memory": profile.triton_memory}
    if profile.gpus:
        limits[profile.gpu_resource] = str(profile.gpus)
    return {"requests": dict(limits), "limits": limits}


def triton_container(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> dict[str, Any]:
    p = ports(settings)
    probe_timeout = math.ceil(settings.gateway.fleet.probe_timeout_s)
    return {
        "name": "triton",
        "image": profile.image,
        "imagePullPolicy": profile.image_pull_policy,
        "args": ["triton"],
        "envFrom": settings_env_from(names),
        "env": env(
            {
                "LLM_TRITON_ADDRESS": "0.0.0.0",
                "LLM_TRITON_HTTP_PORT": p["http"],
                "LLM_TRITON_GRPC_PORT": p["grpc"],
                "LLM_TRITON_METRICS_PORT": p["metrics"],
            }
        )
        + [
            {
                "name": "LLM_TRITON_ADMIN_KEY",
                "valueFrom": {
                    "secretKeyRef": {"name": names.triton_admin_secret, "key": "admin_key", "optional": True}
                },
            }
        ],
        "ports": [{"name": n, "containerPort": port, "protocol": "TCP"} for n, port in p.items()],
        "resources": _resources(profile),
        # minutes to load: the other probes wait until Triton says ready once
        "startupProbe": http_probe("/v2/health/ready", "http", 10, max(1, math.ceil(profile.startup_timeout_s / 10))),
        # ready = ready AND a fixed greedy prompt answers the golden tokens (overloaded counts as ready)
        "readinessProbe": {
            "exec": {"command": ["python", "-m", "serving", "probe", "--timeout-s", str(probe_timeout)]},
            "periodSeconds": 15,
            "timeoutSeconds": probe_timeout + 10,
            "failureThreshold": 2,
        },
        "livenessProbe": http_probe("/v2/health/live", "http", 20, 3),
        # leave the gateway's DNS first, then let in-flight replies finish
        "lifecycle": {
            "preStop": {
                "exec": {
                    "command": [
                        "python",
                        "-m",
                        "serving",
                        "drain",
                        "--delay-s",
                        str(drain_delay_s(settings)),
                        "--timeout-s",
                        str(math.ceil(settings.gateway.drain_timeout_s)),
                    ]
                }
            }
        },
        "securityContext": container_security(read_only_root=False),
        "volumeMounts": [{"name": "data", "mountPath": DATA_DIR}, {"name": "dshm", "mountPath": "/dev/shm"}],
        "workingDir": APP_DIR,
    }


def statefulset(
    settings: DeploymentSettings,
    profile: K8sProfile,
    names: Names,
    settings_checksum: str,
    sidecar: tuple[dict[str, Any], list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """`sidecar`: a container and the volumes it needs (the InferencePool's gateway)."""
    extra_containers, extra_volumes = ([sidecar[0]], sidecar[1]) if sidecar else ([], [])
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": termination_grace_s(settings),
        "securityContext": pod_security(),
        "initContainers": [_init_container(settings, profile, names)],
        "containers": [triton_container(settings, profile, names), *extra_containers],
        "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": profile.shm_size}}, *extra_volumes],
        "affinity": {
            "podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "podAffinityTerm": {
                            "topologyKey": "kubernetes.io/hostname",
                            "labelSelector": {"matchLabels": names.selector("triton")},
                        },
                    }
                ]
            }
        },
    }
    if profile.node_selector:
        pod_spec["nodeSelector"] = dict(profile.node_selector)
    if profile.tolerations:
        pod_spec["tolerations"] = [dict(t) for t in profile.tolerations]
    claim: dict[str, Any] = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": profile.storage_size}},
    }
    if profile.storage_class:
        claim["storageClassName"] = profile.storage_class
    spec: dict[str, Any] = {
        "serviceName": names.triton,
        "podManagementPolicy": "Parallel",  # scale by several at once: each takes minutes to load
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": "Retain", "whenScaled": "Retain"},
        "selector": {"matchLabels": names.selector("triton")},
        "updateStrategy": {"type": "RollingUpdate"},
        "template": {
            "metadata": {"labels": names.labels("triton"), "annotations": {"checksum/settings": settings_checksum}},
            "spec": pod_spec,
        },
        "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": claim}],
    }
    if not profile.autoscale:
        spec["replicas"] = profile.triton_replicas
    # with the HPA, `replicas` is left out: an apply must not undo its scaling
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": meta(names.triton, profile, names.labels("triton")),
        "spec": spec,
    }


def disruption_budget(profile: K8sProfile, names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(names.triton, profile, names.labels("triton")),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": names.selector("triton")}},
    }


def autoscaler(profile: K8sProfile, names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": meta(names.triton, profile, names.labels("triton")),
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": names.triton},
            "minReplicas": profile.triton_replicas,
            "maxReplicas": profile.triton_max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": QUEUE_METRIC},
                        "target": {"type": "AverageValue", "averageValue": str(profile.queue_target_per_replica)},
                    },
                }
            ],
            "behavior": {
                "scaleUp": {
                    "stabilizationWindowSeconds": 0,
                    "selectPolicy": "Max",
                    "policies": [
                        {"type": "Pods", "value": profile.scale_up_pods, "periodSeconds": profile.scale_up_period_s}
                    ],
                },
                "scaleDown": {
                    "stabilizationWindowSeconds": profile.scale_down_stabilization_s,
                    "selectPolicy": "Min",
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": profile.scale_down_period_s}],
                },
            },
        },
    }


def network_policy(
    settings: DeploymentSettings, profile: K8sProfile, names: Names, sidecar_port: int | None
) -> dict[str, Any]:
    """Only the gateway reaches Triton (gRPC for requests, metrics for routing,
    HTTP for nothing but kept for its health API); Prometheus reaches the metrics.
    Kubelet probes come from the node and are not subject to it."""
    p = ports(settings)
    rules: list[dict[str, Any]] = [
        {
            "from": [{"podSelector": {"matchLabels": names.selector("gateway")}}],
            "ports": [{"protocol": "TCP", "port": port} for port in p.values()],
        },
        {
            "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": profile.monitoring_namespace}}}
            ],
            "ports": [{"protocol": "TCP", "port": p["metrics"]}],
        },
    ]
    if sidecar_port is not None:
        # the InferencePool's traffic reaches each pod's own gateway (keys, limits, validation)
        rules.append({"ports": [{"protocol": "TCP", "port": sidecar_port}]})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(names.triton, profile, names.labels("triton")),
        "spec": {
            "podSelector": {"matchLabels": names.selector("triton")},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }
