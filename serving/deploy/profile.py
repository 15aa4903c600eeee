"""The cluster side of a deployment: what Kubernetes needs and the serving
settings do not hold (image, namespace, replicas, resources, node pool,
storage, autoscaling, monitoring). Two profiles, `cpu` and `gpu`, that differ
only in these values; every field can be changed with `--k8s FIELD=VALUE`
(JSON for the dict and list fields)."""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

# The Kubernetes release the manifests are written for and validated against
# (kubernetes-validate --strict): the oldest one they need (StatefulSet PVC
# retention is GA in 1.32).
K8S_VERSION = "1.32.0"

# Where the images keep things (docker/*.Dockerfile): a Triton pod mounts its
# volume over DATA_DIR, so its models and build files live on the PVC.
DATA_DIR = "/var/lib/triton-llm"
CACHE_DIR = f"{DATA_DIR}/cache"
BUILD_DIR = f"{DATA_DIR}/build"
APP_DIR = "/app"
IMAGE_UID = 10001


class ProfileError(ValueError):
    """A profile or a --k8s assignment that does not exist or does not parse."""


@dataclass(frozen=True)
class K8sProfile:
    name: str
    namespace: str = "triton-llm"
    app: str = "triton-llm"  # every object's name starts with it
    image: str = "triton-llm-stack:0.1.0-cpu"
    image_pull_policy: str = "IfNotPresent"
    # Triton replicas: the autoscaler's floor and ceiling (or a fixed count without it)
    triton_replicas: int = 2
    triton_max_replicas: int = 4
    autoscale: bool = True
    triton_cpu: int = 4  # cores, requested = limit; engine.num_threads when unset
    triton_memory: str = "8Gi"
    gpus: int = 0  # per Triton pod
    gpu_resource: str = "nvidia.com/gpu"
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: list[dict[str, str]] = field(default_factory=list)
    shm_size: str = "1Gi"  # /dev/shm: Triton's Python backend and the stages' shared state
    storage_size: str = "10Gi"  # each Triton pod's PVC (weights, golden, rendered repository)
    storage_class: str = ""  # empty: the cluster's default
    # schedule + pull + load + warm up: the startup probe allows this long
    startup_timeout_s: int = 600
    # the HPA: average `llm_num_requests_waiting` per pod it aims at
    queue_target_per_replica: int = 4
    # scale up at most `scale_up_pods` per `scale_up_period_s` (a new pod is not
    # ready for minutes: without a bound the queue would keep adding pods meanwhile)
    scale_up_pods: int = 2
    scale_up_period_s: int = 300
    # scale down only after the queue has been short this long, one pod at a time
    scale_down_stabilization_s: int = 900
    scale_down_period_s: int = 300
    gateway_replicas: int = 2
    gateway_cpu: str = "1"
    gateway_memory: str = "1Gi"
    gateway_service_type: str = "ClusterIP"
    gateway_prestop_s: int = 5  # endpoints update before the gateway stops admitting
    redis: bool = True  # an in-cluster Redis, unless gateway.redis_url names one
    redis_image: str = "redis:7.4.2-alpine"
    monitoring: bool = True  # ServiceMonitors, PrometheusRule, Grafana dashboard (prometheus-operator)
    monitoring_namespace: str = "monitoring"  # where Prometheus runs (allowed to scrape Triton)
    monitoring_labels: dict[str, str] = field(default_factory=dict)  # what the Prometheus selects on
    adapter_namespace: str = "monitoring"  # where prometheus-adapter runs
    inference_pool: bool = False  # an InferencePool over Triton pods with a gateway sidecar each
    epp_service: str = "triton-llm-epp"  # the endpoint picker the InferencePool names
    epp_port: int = 9002


PROFILES: dict[str, dict[str, Any]] = {
    "cpu": {},
    "gpu": {
        "image": "triton-llm-stack:0.1.0-gpu",
        "triton_cpu": 8,
        "triton_memory": "64Gi",
        "triton_max_replicas": 8,
        "gpus": 1,
        "node_selector": {"nvidia.com/gpu.present": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "shm_size": "16Gi",
        "storage_size": "200Gi",
        "startup_timeout_s": 1200,
    },
}


def field_names() -> list[str]:
    return [f.name for f in dataclasses.fields(K8sProfile)]


def load_profile(name: str, assignments: list[str] | tuple[str, ...] = ()) -> K8sProfile:
    """The named profile with `FIELD=VALUE` assignments applied."""
    if name not in PROFILES:
        raise ProfileError(f"--profile: {name!r} is not a profile; profiles are {', '.join(PROFILES)}")
    values: dict[str, Any] = {"name": name, **PROFILES[name]}
    hints = typing.get_type_hints(K8sProfile)
    for item in assignments:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or key not in hints or key == "name":
            raise ProfileError(
                f"--k8s {item!r}: expected FIELD=VALUE with FIELD one of "
                f"{', '.join(n for n in field_names() if n != 'name')}"
            )
        value: Any = raw
        if typing.get_origin(hints[key]) in (dict, list):
            try:
                value = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise ProfileError(f"--k8s {key}: not valid JSON ({exc.msg})") from None
        values[key] = value
    try:
        return TypeAdapter(K8sProfile).validate_python(values)
    except ValidationError as exc:
        raise ProfileError(
            "; ".join(f"--k8s {'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        ) from None
