"""One tritonserver behind the gateway, as the gateway sees it: its client
(the one way to Triton: client/, one gRPC channel), its load (the latest
metrics reading plus the gateway's own in-flight count, which is fresh
between scrapes), its prefix index, its health and whether it is draining."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import GatewayConfig, ReplicaConfig
from .health import Health
from .load import LoadReading
from .prefix import PrefixIndex
from .replica_client import ReplicaClient


@dataclass
class Replica:
    name: str
    config: ReplicaConfig
    upstream: ReplicaClient
    health: Health
    prefix: PrefixIndex = field(default_factory=PrefixIndex)
    load: LoadReading = field(default_factory=LoadReading)
    in_flight: int = 0
    draining: bool = False
    retired: bool = False  # gone from DNS: finishes what it has, takes nothing new

    @classmethod
    def build(
        cls, name: str, config: ReplicaConfig, gateway: GatewayConfig, upstream: ReplicaClient | None = None
    ) -> Replica:
        return cls(
            name,
            config,
            upstream or ReplicaClient(config.grpc_url),
            Health(
                gateway.fleet.eject_after_failures, gateway.fleet.readmit_after_successes, gateway.fleet.eject_backoff_s
            ),
        )

    @property
    def routable(self) -> bool:
        return not self.health.ejected and not self.draining and not self.retired

    def busy(self) -> float:
        """Requests on it: what its engine last said, or what this gateway
        knows it sent since, whichever is more."""
        return max(self.load.waiting + self.load.running, float(self.in_flight))
