"""A real gateway process (`python -m gateway serve`) in front of the real
tritonserver: its public port has no /metrics and no /admin/* (404, and not in
its OpenAPI document); the ops port, on loopback by default, serves them, the
per-key labels only there, /admin still behind the admin key; a SIGTERM stops
both listeners."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import psutil
import pytest

from gateway.admission.keys import KeyStore
from serving.gateway_process import GatewayProcess
from serving.launcher import TritonServer, free_local_ports

pytestmark = pytest.mark.e2e

ADMIN_KEY = "ops-e2e-admin-key-0123456789"
CHAT = {
    "model": "ensemble",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "max_tokens": 4,
    "temperature": 0,
}


def listening(pid: int) -> dict[int, set[str]]:
    found: dict[int, set[str]] = {}
    for conn in psutil.Process(pid).net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN:
            found.setdefault(conn.laddr.port, set()).add(conn.laddr.ip)
    return found


def test_ops_endpoints_are_on_loopback_and_not_on_the_public_port(triton_server: TritonServer, tmp_path: Path):
    (port,) = free_local_ports(1)
    store = KeyStore(tmp_path / "keys.json")
    created = store.create("paid", label="ops-e2e")
    (tmp_path / "admin_key").write_text(ADMIN_KEY)
    # gateway.ops_host left at its default: the test checks where that puts the listener
    process = GatewayProcess(
        [
            f"gateway.port={port}",
            "gateway.host=127.0.0.1",
            "gateway.public_grpc_port=0",
            f"gateway.fleet.upstream_grpc_url={triton_server.grpc_url}",
            f"gateway.keys_file={store.path}",
            f"gateway.admin_key_file={tmp_path / 'admin_key'}",
        ],
        log_path=tmp_path / "gateway.log",
        port=port,
    )
    assert process.ops_url is not None and process.metrics_url is not None
    public, admin = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {ADMIN_KEY}"}
    started = time.monotonic()
    process.start()
    print(f"\n[gateway ready in {time.monotonic() - started:.1f} s: public :{port}, ops {process.ops_url}]")
    try:
        with httpx.Client(timeout=120) as http:
            answer = http.post(
                f"{public}/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {created.key}"}
            )
            assert answer.status_code == 200, answer.text
            ops_port = int(process.ops_url.rsplit(":", 1)[1])
            assert listening(process.process.pid)[ops_port] == {"127.0.0.1"}  # loopback by default
            # the public port: the API and /health only
            for method, path in (
                ("GET", "/metrics"),
                ("GET", "/admin/replicas"),
                ("GET", "/admin/degradation"),
                ("POST", "/admin/replicas/default/drain"),
            ):
                refused = http.request(method, f"{public}{path}", headers=admin)
                assert refused.status_code == 404, (method, path, refused.status_code)
                assert "gateway_key" not in refused.text
            paths = http.get(f"{public}/openapi.json").json()["paths"]
            assert not [p for p in paths if p == "/metrics" or p.startswith("/admin")], sorted(paths)
            assert http.get(f"{public}/health").status_code == 200
            # the ops port: the metrics with the key's labels, /admin behind the admin key
            metrics = http.get(process.metrics_url)
            assert metrics.status_code == 200
            assert f'gateway_key_requests_total{{key_id="{created.record.key_id}",tier="paid"}} 1.0' in metrics.text
            assert http.get(f"{process.ops_url}/admin/replicas").status_code == 401
            assert (
                http.get(
                    f"{process.ops_url}/admin/replicas", headers={"Authorization": f"Bearer {created.key}"}
                ).status_code
                == 401
            )
            replicas = http.get(f"{process.ops_url}/admin/replicas", headers=admin)
            assert replicas.status_code == 200 and replicas.json()["replicas"][0]["name"] == "default"
            assert (
                http.post(
                    f"{public}/v1/chat/completions",
                    json=CHAT,  # the ops port is no door to the API
                    headers={"Authorization": f"Bearer {created.key}"},
                ).status_code
                == 200
            )
            assert (
                http.post(
                    f"{process.ops_url}/v1/chat/completions",
                    json=CHAT,
                    headers={"Authorization": f"Bearer {created.key}"},
                ).status_code
                == 404
            )
    finally:
        stopping = time.monotonic()
        code = process.stop()
        print(f"[SIGTERM: exit {code} in {time.monotonic() - stopping:.1f} s]")
    assert code == 0
    with pytest.raises(httpx.ConnectError):
        httpx.get(process.metrics_url, timeout=5)
