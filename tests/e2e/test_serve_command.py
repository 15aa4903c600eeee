"""`make serve` = `python -m serving serve`: reaches ready, prints a curl that
works (through the gateway's OpenAI API, with the local key), keeps Triton's
own front closed (loopback only, admin APIs behind the key it writes 0600;
the gateway is the one listener beyond loopback), and stops cleanly on
Ctrl-C. One server for the module, started with serve's defaults (no
--address) but a free gateway port."""
from __future__ import annotations

import ipaddress
import os
import re
import shlex
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from serving.launcher import ADMIN_KEY_ENV, ADMIN_KEY_GRPC_METADATA, ADMIN_KEY_HEADER, free_local_ports

from .serve_process import read_until_banner, stop_with_ctrl_c

pytestmark = pytest.mark.e2e


@dataclass
class Serve:
    proc: subprocess.Popen[str]
    build_dir: Path
    http: int
    grpc: int
    metrics: int
    gateway: int
    gateway_grpc: int
    ops: int                 # the gateway's ops port (/metrics, /admin/*), loopback
    output: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.output)

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http}"


@pytest.fixture(scope="module")
def serve(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serve]:
    build_dir = tmp_path_factory.mktemp("serve")
    http, grpc, metrics, gateway, gateway_grpc, ops = free_local_ports(6)
    env = {**os.environ, "LLM_BUILD_DIR": str(build_dir), "LLM_MODEL_DIR": str(model_dir)}
    env.pop(ADMIN_KEY_ENV, None)     # serve's own default: a generated key
    proc = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--http-port", str(http),
                             "--grpc-port", str(grpc), "--metrics-port", str(metrics),
                             "--set", f"gateway.port={gateway}", "--set", f"gateway.public_grpc_port={gateway_grpc}",
                             "--set", f"gateway.ops_port={ops}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    started = Serve(proc, build_dir, http, grpc, metrics, gateway, gateway_grpc, ops)
    try:
        t0 = time.monotonic()
        read_until_banner(proc, started.output, 300)
        print(f"\n[serve ready in {time.monotonic() - t0:.1f} s on :{http}]")
        assert "ready." in started.text, started.text
        yield started
    finally:
        stop_with_ctrl_c(proc, 60)


def test_serve_prints_a_working_curl(serve: Serve):
    match = re.search(r"^(curl .*?)(?=\n\n)", serve.text, re.S | re.M)
    assert match, serve.text
    curl = match.group(1).replace("\\\n", " ")
    t0 = time.monotonic()
    answer = subprocess.run(shlex.split(curl), capture_output=True, text=True, timeout=120)
    print(f"[curl answered in {time.monotonic() - t0:.1f} s]")
    assert answer.returncode == 0, answer.stderr
    assert "data:" in answer.stdout and "Paris" in answer.stdout, answer.stdout


def _listening(process: psutil.Process) -> set[tuple[str, int]]:
    """(address, port) of its listening TCP sockets; IPv4-mapped IPv6 as IPv4
    (Triton's gRPC port listens as [::ffff:127.0.0.1])."""
    found = set()
    for conn in process.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN:
            ip = ipaddress.ip_address(conn.laddr.ip)
            mapped = getattr(ip, "ipv4_mapped", None)
            found.add((str(mapped or ip), conn.laddr.port))
    return found


def test_triton_listens_on_loopback_only(serve: Serve):
    t0 = time.monotonic()
    tree = psutil.Process(serve.proc.pid).children(recursive=True)
    triton = [p for p in tree if p.name() == "tritonserver"]
    assert len(triton) == 1, [(p.pid, p.name()) for p in tree]
    sockets = _listening(triton[0])
    assert {port for _, port in sockets} >= {serve.http, serve.grpc, serve.metrics}, sockets
    assert {address for address, _ in sockets} <= {"127.0.0.1", "::1"}, sockets
    # nothing else serve started (the Python stubs) listens beyond loopback either,
    # but the gateway, the public front door, on its two ports (HTTP and the gRPC door);
    # its ops port (/metrics, /admin/*) is on loopback
    for process in tree:
        listening = _listening(process)
        if any(port == serve.gateway for _, port in listening):
            assert "gateway" in " ".join(process.cmdline()), process
            assert {p for _, p in listening} == {serve.gateway, serve.gateway_grpc, serve.ops}, listening
            assert {a for a, p in listening if p == serve.ops} == {"127.0.0.1"}, listening
            assert f"Ops         http://127.0.0.1:{serve.ops}/metrics" in serve.text, serve.text
            with httpx.Client(timeout=10) as http:
                assert http.get(f"http://127.0.0.1:{serve.gateway}/metrics").status_code == 404
                assert http.get(f"http://127.0.0.1:{serve.ops}/metrics").status_code == 200
            continue
        assert {address for address, _ in listening} <= {"127.0.0.1", "::1"}, process
    print(f"[tritonserver {triton[0].pid} listens on {sorted(sockets)}; checked {len(tree)} processes "
          f"in {time.monotonic() - t0:.2f} s]")


def _admin_key(serve: Serve) -> tuple[Path, str]:
    match = re.search(r"^  admin +key in (\S+)", serve.text, re.M)
    assert match, serve.text
    path = Path(match.group(1))
    return path, path.read_text().strip()


def test_the_admin_key_file_is_owner_only_and_never_printed(serve: Serve):
    path, key = _admin_key(serve)
    assert path == serve.build_dir / "admin_key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(key) >= 40
    assert key not in serve.text
    assert key not in (serve.build_dir / "tritonserver.log").read_text(errors="replace")


def test_admin_apis_need_the_key_and_the_public_ones_do_not(serve: Serve):
    _, key = _admin_key(serve)
    admin = {ADMIN_KEY_HEADER: key}
    t0 = time.monotonic()
    with httpx.Client(base_url=serve.http_url, timeout=30) as http:
        assert http.post("/v2/logging", json={}).status_code == 403
        assert http.post("/v2/logging", json={}, headers={ADMIN_KEY_HEADER: "wrong-key-0123456789"}).status_code == 403
        assert http.post("/v2/logging", json={}, headers=admin).status_code == 200
        assert http.get("/v2/models/stats").status_code == 403
        assert http.get("/v2/models/stats", headers=admin).status_code == 200
        assert http.post("/v2/repository/index").status_code == 403
        assert http.get("/v2/trace/setting").status_code == 403
        # open on purpose: probes, clients and the contract tool use them
        assert http.get("/v2/health/ready").status_code == 200
        assert http.get("/v2/models/ensemble/config").status_code == 200
        assert http.get(f"http://127.0.0.1:{serve.metrics}/metrics").status_code == 200
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{serve.grpc}")
    try:
        assert grpc.is_server_ready()
        with pytest.raises(InferenceServerException, match="restricted"):
            grpc.get_inference_statistics()
        with pytest.raises(InferenceServerException, match="restricted"):
            grpc.get_inference_statistics(headers={ADMIN_KEY_HEADER: key})    # gRPC wants the prefixed name
        assert grpc.get_inference_statistics(headers={ADMIN_KEY_GRPC_METADATA: key}) is not None
    finally:
        grpc.close()
    print(f"[admin checks over HTTP and gRPC in {time.monotonic() - t0:.2f} s]")


def test_serve_stops_cleanly_on_ctrl_c(serve: Serve):
    t0 = time.monotonic()
    triton = [p for p in psutil.Process(serve.proc.pid).children(recursive=True) if p.name() == "tritonserver"]
    stop_with_ctrl_c(serve.proc, 60)
    print(f"[serve stopped in {time.monotonic() - t0:.1f} s]")
    assert serve.proc.returncode == 0, serve.text + serve.proc.stdout.read()
    assert not [p for p in triton if p.is_running()]
