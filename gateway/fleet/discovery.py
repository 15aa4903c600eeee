"""Replicas from DNS: in a cluster the gateway follows a headless service
(`gateway.fleet.discovery_dns = "triton.llm.svc.cluster.local:8001"`), whose name
resolves to one address per ready pod. Every `discovery_interval_s` the name
is resolved again: a new address is a new replica (probed before it gets
callers, like any other), a vanished one is retired (it finishes its
in-flight requests, takes no new ones, then leaves). A failed lookup keeps
the fleet as it is: a DNS hiccup must not empty it."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from ..config import GatewayConfig, ReplicaConfig
from ..ops.metrics import REPLICAS_DISCOVERED
from .replica import Replica

if TYPE_CHECKING:
    from .fleet import Fleet

log = logging.getLogger(__name__)

Resolver = Callable[[str, int], Awaitable[list[str]]]


async def resolve(host: str, port: int) -> list[str]:
    """The name's addresses (A and AAAA records), sorted."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def parse_target(target: str) -> tuple[str, int]:
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"gateway.fleet.discovery_dns: expected host:grpc_port, got {target!r}")
    return host.strip("[]"), int(port)


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


class Discovery:
    def __init__(self, fleet: Fleet, config: GatewayConfig, resolver: Resolver = resolve) -> None:
        self.fleet = fleet
        self.config = config
        self.host, self.port = parse_target(config.fleet.discovery_dns)
        self.resolver = resolver
        self.resolved = asyncio.Event()  # set after the first lookup, whatever it found
        self._names: set[str] = set()

    def replica_config(self, address: str) -> ReplicaConfig:
        return ReplicaConfig(
            grpc_url=f"{_host(address)}:{self.port}",
            metrics_url=f"http://{_host(address)}:{self.config.fleet.discovery_metrics_port}/metrics",
        )

    async def refresh(self) -> None:
        try:
            addresses = await self.resolver(self.host, self.port)
        except OSError as exc:
            log.warning(
                "resolving %s failed (%r); keeping the %d replicas found before", self.host, exc, len(self._names)
            )
            return
        finally:
            self.resolved.set()
        found = {f"{_host(a)}:{self.port}": a for a in addresses}
        for name, address in found.items():
            if name not in self.fleet.by_name:
                self.fleet.add(Replica.build(name, self.replica_config(address), self.config))
            else:  # maybe back before it had left
                self.fleet.retire(name, retired=False)
        for name in self._names - found.keys():
            if name in self.fleet.by_name:
                self.fleet.retire(name)
        self._names = set(found)
        REPLICAS_DISCOVERED.set(len(found))
        await self.fleet.sweep()

    async def run(self, stopping: asyncio.Event) -> None:
        while not stopping.is_set():
            try:
                await self.refresh()
            except Exception:
                log.exception("replica discovery failed; trying again")
            try:
                await asyncio.wait_for(stopping.wait(), self.config.fleet.discovery_interval_s)
            except TimeoutError:
                pass
