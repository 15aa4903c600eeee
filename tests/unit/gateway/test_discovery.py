"""Replicas from DNS (a headless service), with a scripted resolver: new
addresses join, vanished ones are retired and leave once idle, a failed
lookup changes nothing."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import FleetConfig, GatewayConfig
from gateway.fleet.discovery import parse_target
from gateway.fleet.fleet import Fleet


class ScriptedDNS:
    def __init__(self, *answers: list[str] | OSError) -> None:
        self.answers = list(answers)
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int) -> list[str]:
        self.asked.append((host, port))
        answer = self.answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer


def test_the_fleet_follows_the_dns_name():
    config = GatewayConfig(
        fleet=FleetConfig(discovery_dns="triton.llm.svc.cluster.local:8001", discovery_metrics_port=8002)
    )
    fleet = Fleet(config, [])
    dns = ScriptedDNS(
        ["10.0.0.1", "10.0.0.2"], ["10.0.0.2", "10.0.0.3"], OSError("SERVFAIL"), ["10.0.0.3"], ["10.0.0.3", "fd00::7"]
    )
    fleet.discovery.resolver = dns

    async def scenario():
        names = []
        await fleet.discovery.refresh()
        names.append(sorted(fleet.by_name))
        first = fleet.by_name["10.0.0.1:8001"]
        first.in_flight = 1  # a stream still runs there
        await fleet.discovery.refresh()
        names.append(sorted(fleet.by_name))
        retired_routable = first.routable
        await fleet.discovery.refresh()  # the lookup fails: nothing changes
        names.append(sorted(fleet.by_name))
        first.in_flight = 0
        await fleet.discovery.refresh()
        names.append(sorted(fleet.by_name))
        await fleet.discovery.refresh()
        names.append(sorted(fleet.by_name))
        await fleet.aclose()
        return names, retired_routable

    names, retired_routable = asyncio.run(scenario())
    assert dns.asked[0] == ("triton.llm.svc.cluster.local", 8001)
    assert names[0] == ["10.0.0.1:8001", "10.0.0.2:8001"]
    assert names[1] == ["10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.3:8001"], "the busy one stays until idle"
    assert not retired_routable, "a retired replica takes no new requests"
    assert names[2] == names[1]
    assert names[3] == ["10.0.0.3:8001"]
    assert names[4] == ["10.0.0.3:8001", "[fd00::7]:8001"]
    ipv6 = fleet.by_name["[fd00::7]:8001"].config
    assert (ipv6.grpc_url, ipv6.metrics_url) == ("[fd00::7]:8001", "http://[fd00::7]:8002/metrics")


def test_a_replica_back_in_dns_before_it_left_takes_requests_again():
    fleet = Fleet(GatewayConfig(fleet=FleetConfig(discovery_dns="svc:8001")), [])
    fleet.discovery.resolver = ScriptedDNS(["10.0.0.1"], [], ["10.0.0.1"])

    async def scenario():
        await fleet.discovery.refresh()
        fleet.by_name["10.0.0.1:8001"].in_flight = 1
        await fleet.discovery.refresh()
        gone = fleet.by_name["10.0.0.1:8001"].routable
        await fleet.discovery.refresh()
        back = fleet.by_name["10.0.0.1:8001"].routable
        await fleet.aclose()
        return gone, back

    assert asyncio.run(scenario()) == (False, True)


@pytest.mark.parametrize("target", ["svc", "svc:", ":8001", "svc:http", "svc:70000"])
def test_a_discovery_target_needs_host_and_port(target):
    with pytest.raises(ValueError, match=r"^gateway\.fleet\.discovery_dns: expected host:grpc_port"):
        parse_target(target)
