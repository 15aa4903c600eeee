"""The gateway: 2+ replicas behind a Service (the one public door: the API
ports only), their PodDisruptionBudget, and the Redis they share (rate limits,
resumable streams, a DELETE through any replica) with a NetworkPolicy that
admits only gateways. The ops port (/metrics, /admin/*) listens on the pod IP
for Prometheus, found through a headless Service of its own, and a
NetworkPolicy admits only the monitoring namespace to it (an operator reaches
/admin with `kubectl port-forward`). Keys and the admin key come from a
Secret the operator creates (`<app>-gateway`: `keys.json`, `admin_key`)."""

from __future__ import annotations

import math
from typing import Any

from ..settings import DeploymentSettings
from .common import container_security, env, http_probe, meta, pod_security, settings_env_from
from .names import Names
from .profile import K8sProfile
from .settings_env import GATEWAY_SECRET_DIR, GOLDEN_MOUNT, REDIS_PORT

# the gateway's own stop after its drain (uvicorn's graceful shutdown, gateway/__main__.py)
GATEWAY_STOP_S = 10


def termination_grace_s(settings: DeploymentSettings, profile: K8sProfile) -> int:
    """preStop (endpoints update), then SIGTERM: the gateway stops admitting and
    waits up to drain_timeout_s for its replies, then shuts down."""
    return profile.gateway_prestop_s + math.ceil(settings.gateway.drain_timeout_s) + GATEWAY_STOP_S + 5


def container_ports(settings: DeploymentSettings) -> list[dict[str, Any]]:
    """The public ports: what the Service exposes."""
    ports = [{"name": "http", "containerPort": settings.gateway.port, "protocol": "TCP"}]
    if settings.gateway.public_grpc_port:
        ports.append({"name": "grpc", "containerPort": settings.gateway.public_grpc_port, "protocol": "TCP"})
    return ports


def ops_ports(settings: DeploymentSettings) -> list[dict[str, Any]]:
    """The ops port, when it listens beyond the pod's loopback (for Prometheus); never in the public Service."""
    g = settings.gateway
    if not g.ops_port or g.ops_host in ("127.0.0.1", "localhost", "::1"):
        return []
    return [{"name": "ops", "containerPort": g.ops_port, "protocol": "TCP"}]


def gateway_container(
    settings: DeploymentSettings,
    profile: K8sProfile,
    names: Names,
    *,
    name: str = "gateway",
    overrides: dict[str, str] | None = None,
    golden: bool = False,
) -> dict[str, Any]:
    """`overrides`: LLM__GATEWAY__* values that beat the settings ConfigMap (a sidecar's upstream)."""
    mounts = [
        {"name": "gateway-secret", "mountPath": GATEWAY_SECRET_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if golden:
        mounts.append({"name": "golden", "mountPath": GOLDEN_MOUNT.rsplit("/", 1)[0], "readOnly": True})
    return {
        "name": name,
        "image": profile.image,
        "imagePullPolicy": profile.image_pull_policy,
        "args": ["gateway"],
        "envFrom": settings_env_from(names),
        # the gateway writes nothing but under its build dir: a tmpfs, the root stays read-only
        "env": env({"LLM_BUILD_DIR": "/tmp/triton-llm", **(overrides or {})}),
        "ports": container_ports(settings) + ops_ports(settings),
        "resources": {
            "requests": {"cpu": profile.gateway_cpu, "memory": profile.gateway_memory},
            "limits": {"cpu": profile.gateway_cpu, "memory": profile.gateway_memory},
        },
        # /health answers 503 once draining: out of the Service before anything is refused
        "readinessProbe": http_probe("/health", "http", 5, 2),
        # not /health: a draining gateway is alive and must not be restarted
        "livenessProbe": {
            "tcpSocket": {"port": "http"},
            "periodSeconds": 20,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(profile.gateway_prestop_s)]}}},
        "securityContext": container_security(read_only_root=True),
        "volumeMounts": mounts,
    }


def gateway_volumes(names: Names, golden: bool) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": "gateway-secret", "secret": {"secretName": names.gateway_secret}},
        {"name": "tmp", "emptyDir": {}},
    ]
    if golden:
        volumes.append({"name": "golden", "configMap": {"name": names.golden}})
    return volumes


def deployment(
    settings: DeploymentSettings, profile: K8sProfile, names: Names, settings_checksum: str, golden: bool
) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta(names.gateway, profile, names.labels("gateway")),
        "spec": {
            "replicas": profile.gateway_replicas,
            "selector": {"matchLabels": names.selector("gateway")},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}},
            "template": {
                "metadata": {
                    "labels": names.labels("gateway"),
                    "annotations": {"checksum/settings": settings_checksum},
                },
                "spec": {
                    "terminationGracePeriodSeconds": termination_grace_s(settings, profile),
                    "securityContext": pod_security(),
                    "containers": [gateway_container(settings, profile, names, golden=golden)],
                    "volumes": gateway_volumes(names, golden),
                    "affinity": {
                        "podAntiAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 100,
                                    "podAffinityTerm": {
                                        "topologyKey": "kubernetes.io/hostname",
                                        "labelSelector": {"matchLabels": names.selector("gateway")},
                                    },
                                }
                            ]
                        }
                    },
                },
            },
        },
    }


def service(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> dict[str, Any]:
    ports = [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
        for p in container_ports(settings)
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta(names.gateway, profile, names.labels("gateway")),
        "spec": {"type": profile.gateway_service_type, "selector": names.selector("gateway"), "ports": ports},
    }


def ops_service(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> list[dict[str, Any]]:
    """Headless (no virtual IP, nothing proxied): only names the pods' ops port for
    the ServiceMonitor; not-ready pods too, so a draining gateway is still scraped."""
    ports = [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
        for p in ops_ports(settings)
    ]
    if not ports:
        return []
    return [
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(names.gateway_ops, profile, names.labels("gateway")),
            "spec": {
                "clusterIP": "None",
                "publishNotReadyAddresses": True,
                "selector": names.selector("gateway"),
                "ports": ports,
            },
        }
    ]


def network_policy(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> dict[str, Any]:
    """The API ports from anywhere; the ops port from the monitoring namespace only.
    Kubelet probes come from the node and are not subject to it."""
    rules: list[dict[str, Any]] = [
        {"ports": [{"protocol": "TCP", "port": p["containerPort"]} for p in container_ports(settings)]}
    ]
    for p in ops_ports(settings):
        rules.append(
            {
                "from": [
                    {
                        "namespaceSelector": {
                            "matchLabels": {"kubernetes.io/metadata.name": profile.monitoring_namespace}
                        }
                    }
                ],
                "ports": [{"protocol": "TCP", "port": p["containerPort"]}],
            }
        )
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(names.gateway, profile, names.labels("gateway")),
        "spec": {
            "podSelector": {"matchLabels": names.selector("gateway")},
            "policyTypes": ["Ingress"],
            "ingress": rules,
        },
    }


def disruption_budget(profile: K8sProfile, names: Names) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": meta(names.gateway, profile, names.labels("gateway")),
        "spec": {"minAvailable": 1, "selector": {"matchLabels": names.selector("gateway")}},
    }


def redis(profile: K8sProfile, names: Names, client_components: tuple[str, ...]) -> list[dict[str, Any]]:
    """One Redis without persistence: its data (counters, stream mirrors) lives minutes."""
    labels, selector = names.labels("redis"), names.selector("redis")
    container = {
        "name": "redis",
        "image": profile.redis_image,
        "imagePullPolicy": profile.image_pull_policy,
        "args": ["--save", "", "--appendonly", "no", "--maxmemory", "200mb", "--maxmemory-policy", "volatile-lru"],
        "ports": [{"name": "redis", "containerPort": REDIS_PORT, "protocol": "TCP"}],
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "readinessProbe": {"exec": {"command": ["redis-cli", "ping"]}, "periodSeconds": 5, "timeoutSeconds": 2},
        "livenessProbe": {"tcpSocket": {"port": "redis"}, "periodSeconds": 20, "timeoutSeconds": 2},
        "securityContext": {**container_security(read_only_root=True)},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
    }
    return [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta(names.redis, profile, labels),
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": selector},
                "strategy": {"type": "Recreate"},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "securityContext": {
                            "runAsNonRoot": True,
                            "runAsUser": 999,
                            "runAsGroup": 999,
                            "fsGroup": 999,
                            "seccompProfile": {"type": "RuntimeDefault"},
                        },
                        "containers": [container],
                        "volumes": [{"name": "data", "emptyDir": {}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta(names.redis, profile, labels),
            "spec": {
                "selector": selector,
                "ports": [{"name": "redis", "port": REDIS_PORT, "targetPort": "redis", "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": meta(names.redis, profile, labels),
            "spec": {
                "podSelector": {"matchLabels": selector},
                "policyTypes": ["Ingress"],
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": names.selector(c)}} for c in client_components],
                        "ports": [{"protocol": "TCP", "port": REDIS_PORT}],
                    }
                ],
            },
        },
    ]
