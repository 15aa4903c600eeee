"""Graceful degradation against the real stack: a tritonserver whose engine
runs one sequence at a time (`max_num_seqs=1`), so concurrent requests queue,
and the gateway as its own process scraping that replica's metrics, with a
short window and dwell times and a low queue-time threshold.

Sustained concurrent paid requests raise the mean queue time above the enter
threshold; the level climbs one step per enter dwell to 2 and beyond, where
a free-tier key is refused with 429 + Retry-After. Once the load stops, the
window forgets it and the level steps back to 0, one exit dwell a step."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.admission.keys import KeyStore
from serving.gateway_process import GatewayProcess
from serving.launcher import TritonServer, free_local_ports
from tests.e2e.fleet_helpers import wait_until

pytestmark = pytest.mark.e2e

WINDOW_S, ENTER_DWELL_S, EXIT_DWELL_S = 3.0, 3.0, 3.0
QUEUE_ENTER_S, QUEUE_EXIT_S = 0.5, 0.2
CONCURRENT = 5


@dataclass
class DegradingGateway:
    process: GatewayProcess
    url: str
    paid_key: str
    free_key: str

    def metric(self, name: str, labels: str = "") -> float | None:
        text = httpx.get(self.process.metrics_url, timeout=10).text
        for line in text.splitlines():
            if line.startswith(f"{name}{labels} ") or line.startswith(f"{name}{labels}{{"):
                return float(line.rsplit(" ", 1)[1])
        return None

    def level(self) -> int:
        return int(self.metric("gateway_degradation_level") or 0)


@pytest.fixture(scope="module")
def single_sequence(start_triton) -> Iterator[TritonServer]:
    server = start_triton(max_num_seqs=1)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def gateway(single_sequence: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DegradingGateway]:
    work: Path = tmp_path_factory.mktemp("degrade")
    (port,) = free_local_ports(1)
    store = KeyStore(work / "keys.json")
    paid, free = store.create("paid", label="load").key, store.create("free", label="shed").key
    replicas = {"one": {"grpc_url": single_sequence.grpc_url, "metrics_url": single_sequence.metrics_url}}
    process = GatewayProcess(
        [
            f"gateway.port={port}",
            "gateway.host=127.0.0.1",
            "gateway.public_grpc_port=0",
            f"gateway.keys_file={store.path}",
            f"gateway.fleet.replicas={json.dumps(replicas)}",
            "gateway.fleet.metrics_interval_s=0.25",
            f"gateway.degradation.window_s={WINDOW_S}",
            f"gateway.degradation.enter_dwell_s={ENTER_DWELL_S}",
            f"gateway.degradation.exit_dwell_s={EXIT_DWELL_S}",
            f"gateway.degradation.queue_time_enter_s={QUEUE_ENTER_S}",
            f"gateway.degradation.queue_time_exit_s={QUEUE_EXIT_S}",
        ],
        log_path=work / "gateway.log",
        port=port,
    )
    process.start()
    started = DegradingGateway(process, f"http://127.0.0.1:{port}", paid, free)
    yield started
    assert process.stop() == 0


@dataclass
class SustainedLoad:
    """`CONCURRENT` callers, each sending streamed completions back to back until stopped."""

    gateway: DegradingGateway
    stop: threading.Event = field(default_factory=threading.Event)
    statuses: list[int] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> SustainedLoad:
        for index in range(CONCURRENT):
            thread = threading.Thread(target=self._caller, args=(index,), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _caller(self, index: int) -> None:
        body = {
            "model": "ensemble",
            "prompt": f"Write a long story about a lighthouse ({index}).",
            "max_tokens": 24,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        with httpx.Client(timeout=httpx.Timeout(30.0, read=120.0)) as client:
            while not self.stop.is_set():
                with client.stream(
                    "POST",
                    f"{self.gateway.url}/v1/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {self.gateway.paid_key}"},
                ) as response:
                    for _ in response.iter_lines():
                        pass
                    self.statuses.append(response.status_code)

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)


def test_sustained_queueing_sheds_the_free_tier_and_recovery_brings_the_level_back(gateway: DegradingGateway):
    assert gateway.level() == 0
    load = SustainedLoad(gateway).start()
    try:
        entered_s = wait_until(lambda: gateway.level() >= 2, 90.0, "degradation level 2 under sustained queueing")
        queue_time = gateway.metric("gateway_degradation_signal", '{signal="queue_time"}')
        refused = httpx.post(
            f"{gateway.url}/v1/chat/completions",
            timeout=30,
            json={"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
            headers={"Authorization": f"Bearer {gateway.free_key}"},
        )
    finally:
        load.finish()
    print(
        f"\n[level >= 2 after {entered_s:.1f} s of load (window {WINDOW_S} s, enter dwell {ENTER_DWELL_S} s); "
        f"queue time over the window {queue_time} s; {len(load.statuses)} paid requests served]"
    )
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "degraded_overload"
    assert int(refused.headers["retry-after"]) >= 1 and "retry-after-ms" in refused.headers
    assert load.statuses and set(load.statuses) == {200}, "the paid tier is never shed"
    ups = gateway.metric("gateway_degradation_changes_total", '{cause="queue_time",direction="up"}')
    assert ups is not None and ups >= 2

    recovered_s = wait_until(lambda: gateway.level() == 0, 90.0, "degradation level back to 0 after the load")
    print(f"[level 0 again {recovered_s:.1f} s after the load stopped (exit dwell {EXIT_DWELL_S} s a step)]")
    served = httpx.post(
        f"{gateway.url}/v1/chat/completions",
        timeout=60,
        json={"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4},
        headers={"Authorization": f"Bearer {gateway.free_key}"},
    )
    assert served.status_code == 200, served.text
