"""What Prometheus, Grafana and the autoscaler need, for prometheus-operator:
a ServiceMonitor per component (job = the component: `triton`, `gateway`, the
names compose's Prometheus uses too), the recording and alert rules of
deploy/prometheus/rules/ as a PrometheusRule, the Grafana dashboard of
deploy/grafana/dashboards/ as a ConfigMap Grafana's sidecar loads, and the
prometheus-adapter rule that serves the HPA's queue metric. One copy of each
rule and panel: compose mounts the same files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from ..paths import REPO_ROOT
from ..settings import DeploymentSettings
from .common import meta
from .gateway import ops_ports
from .names import Names
from .profile import K8sProfile
from .triton import QUEUE_METRIC

DEPLOY_DIR = REPO_ROOT / "deploy"
RULES_DIR = DEPLOY_DIR / "prometheus" / "rules"
DASHBOARDS_DIR = DEPLOY_DIR / "grafana" / "dashboards"
JOB_LABEL = "app.kubernetes.io/component"
SCRAPE_INTERVAL = "15s"


def _labels(names: Names, profile: K8sProfile, component: str) -> dict[str, str]:
    return {**names.labels(component), **profile.monitoring_labels}


def service_monitors(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> list[dict[str, Any]]:
    """Triton's metrics port; the gateways' ops port (its headless Service, gateway.py),
    never the public one, which has no /metrics."""

    def monitor(component: str, port: str) -> dict[str, Any]:
        return {
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": meta(f"{profile.app}-{component}", profile, _labels(names, profile, component)),
            "spec": {
                "jobLabel": JOB_LABEL,
                "selector": {"matchLabels": names.selector(component)},
                "namespaceSelector": {"matchNames": [profile.namespace]},
                "endpoints": [{"port": port, "path": "/metrics", "interval": SCRAPE_INTERVAL}],
            },
        }

    return [monitor("triton", "metrics"), *([monitor("gateway", "ops")] if ops_ports(settings) else [])]


def rule_files() -> list[Path]:
    return sorted(RULES_DIR.glob("*.yml"))


def prometheus_rule(profile: K8sProfile, names: Names) -> dict[str, Any]:
    groups: list[Any] = []
    for path in rule_files():
        groups.extend(yaml.safe_load(path.read_text(encoding="utf-8"))["groups"])
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PrometheusRule",
        "metadata": meta(profile.app, profile, _labels(names, profile, "monitoring")),
        "spec": {"groups": groups},
    }


def dashboard_files() -> list[Path]:
    return sorted(DASHBOARDS_DIR.glob("*.json"))


def dashboards(profile: K8sProfile, names: Names) -> dict[str, Any]:
    data = {path.name: json.dumps(json.loads(path.read_text(encoding="utf-8")), indent=1) for path in dashboard_files()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(
            f"{profile.app}-dashboards", profile, {**names.labels("monitoring"), "grafana_dashboard": "1"}
        ),
        "data": data,
    }


def adapter_rules() -> dict[str, Any]:
    """prometheus-adapter's custom-metrics rule: each Triton pod's queue, averaged over
    a minute (a single scrape's spike does not add a pod that takes minutes to start)."""
    return {
        "rules": [
            {
                "seriesQuery": f'{QUEUE_METRIC}{{namespace!="",pod!=""}}',
                "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "name": {"matches": f"^{QUEUE_METRIC}$", "as": QUEUE_METRIC},
                "metricsQuery": "sum(avg_over_time(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)",
            }
        ]
    }


def adapter_config(profile: K8sProfile, names: Names) -> dict[str, Any]:
    """The rules as prometheus-adapter's config file (`--config`), in its namespace;
    with its Helm chart, the same list goes under `rules.custom`."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(
            f"{profile.app}-prometheus-adapter",
            profile,
            names.labels("monitoring"),
            namespace=profile.adapter_namespace,
        ),
        "data": {"config.yaml": yaml.safe_dump(adapter_rules(), sort_keys=False)},
    }


def objects(settings: DeploymentSettings, profile: K8sProfile, names: Names) -> list[dict[str, Any]]:
    return [*service_monitors(settings, profile, names), prometheus_rule(profile, names), dashboards(profile, names)]
