"""Object names and labels, from the profile's `app` prefix."""

from __future__ import annotations

from dataclasses import dataclass

from .profile import K8sProfile


@dataclass(frozen=True)
class Names:
    app: str

    @property
    def triton(self) -> str:  # StatefulSet, its headless Service (the gateway's DNS name), PDB, HPA
        return f"{self.app}-triton"

    @property
    def gateway(self) -> str:
        return f"{self.app}-gateway"

    @property
    def gateway_ops(self) -> str:  # the headless Service Prometheus finds the gateways' ops port by
        return f"{self.app}-gateway-ops"

    @property
    def redis(self) -> str:
        return f"{self.app}-redis"

    @property
    def settings(self) -> str:  # the ConfigMap of LLM__* variables
        return f"{self.app}-settings"

    @property
    def golden(self) -> str:  # the ConfigMap of the probe's golden answer (--golden)
        return f"{self.app}-probe-golden"

    @property
    def gateway_secret(self) -> str:  # keys.json + admin_key, created by the operator
        return f"{self.app}-gateway"

    @property
    def triton_admin_secret(self) -> str:  # admin_key for Triton's restricted APIs (optional)
        return f"{self.app}-triton-admin"

    def labels(self, component: str) -> dict[str, str]:
        return {
            **self.selector(component),
            "app.kubernetes.io/part-of": "triton-llm-stack",
            "app.kubernetes.io/managed-by": "serving-render-k8s",
        }

    def selector(self, component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": self.app, "app.kubernetes.io/component": component}


def names_for(profile: K8sProfile) -> Names:
    return Names(profile.app)
