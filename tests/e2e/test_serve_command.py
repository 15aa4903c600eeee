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
from tests.e2e.serve_process import (
    api_key,
    bound_ports,
    gone_within,
    hang_up_a_stream,
    ours,
    read_until_banner,
    shm_files,
    stop_with_ctrl_c,
)

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
    ops: int  # the gateway's ops port (/metrics, /admin/*), loopback
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
    env.pop(ADMIN_KEY_ENV, None)  # serve's own default: a generated key
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving",
            "serve",
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
            "--set",
            f"gateway.port={gateway}",
            "--set",
            f"gateway.public_grpc_port={gateway_grpc}",
            "--set",
            f"gateway.ops_port={ops}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
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
    print(
        f"[tritonserver {triton[0].pid} listens on {sorted(sockets)}; checked {len(tree)} processes "
        f"in {time.monotonic() - t0:.2f} s]"
    )


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
            grpc.get_inference_statistics(headers={ADMIN_KEY_HEADER: key})  # gRPC wants the prefixed name
        assert grpc.get_inference_statistics(headers={ADMIN_KEY_GRPC_METADATA: key}) is not None
    finally:
        grpc.close()
    print(f"[admin checks over HTTP and gRPC in {time.monotonic() - t0:.2f} s]")


def test_serve_stops_within_10_s_of_ctrl_c_after_a_cancelled_stream(serve: Serve):
    """The issue's bound: Ctrl-C ends serve within 10 s once its work is done
    or cancelled (a hung-up stream leaves an ensemble request that Triton 2.51
    counts as in flight until its exit timeout), and leaves nothing behind."""
    tree = psutil.Process(serve.proc.pid).children(recursive=True)
    triton = [p for p in tree if p.name() == "tritonserver"]
    assert len(triton) == 1, [(p.pid, p.name()) for p in tree]
    hung_up = hang_up_a_stream(serve.gateway, api_key(serve.text))
    t0 = time.monotonic()
    stop_with_ctrl_c(serve.proc, 60)
    took = time.monotonic() - t0
    rest = serve.proc.stdout.read()
    print(f"[a stream hung up after {hung_up:.1f} s; serve (1 replica) stopped {took:.1f} s after Ctrl-C]\n{rest}")
    assert serve.proc.returncode == 0, serve.text + rest
    assert "stopping tritonserver... (each waits up to" in rest, rest  # what it waits for, said
    assert took <= 10.0, f"Ctrl-C took {took:.1f} s (bound 10 s)\n{rest}"
    _, alive = psutil.wait_procs(tree, timeout=5)
    assert not alive, [(p.pid, p.name()) for p in alive]
    assert not shm_files([serve.build_dir])
    assert not bound_ports([serve.http, serve.grpc, serve.metrics, serve.gateway, serve.ops])


def test_a_sigkilled_serve_leaves_no_process_port_or_shm_behind(
    model_dir: Path, tmp_path_factory: pytest.TempPathFactory
):
    """A launcher killed by SIGKILL (no handler runs) takes its tritonserver,
    the stubs, the reaper and the gateway with it (parent-death signals), and
    the /dev/shm files are removed by the reaper."""
    build_dir = tmp_path_factory.mktemp("serve-killed")
    http, grpc, metrics, gateway, ops = free_local_ports(5)
    env = {**os.environ, "LLM_BUILD_DIR": str(build_dir), "LLM_MODEL_DIR": str(model_dir)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving",
            "serve",
            "--http-port",
            str(http),
            "--grpc-port",
            str(grpc),
            "--metrics-port",
            str(metrics),
            "--set",
            f"gateway.port={gateway}",
            "--set",
            "gateway.public_grpc_port=0",
            "--set",
            f"gateway.ops_port={ops}",
            "--set",
            "server.supervisor_metrics_port=0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    output: list[str] = []
    tree: list[psutil.Process] = []
    try:
        read_until_banner(proc, output, 300)
        assert "ready." in "".join(output), "".join(output)
        tree = psutil.Process(proc.pid).children(recursive=True)
        names = sorted(p.name() for p in tree)
        assert "tritonserver" in names and any("gateway" in " ".join(p.cmdline()) for p in tree), names
        assert shm_files([build_dir]), "the server's shm segments should carry its prefix"
        hang_up_a_stream(gateway, api_key("".join(output)))  # an in-flight request left behind, too
        proc.kill()
        proc.wait(10)
        took, left = gone_within(30, lambda: [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE])
        print(f"\n[serve SIGKILLed: its {len(tree)} processes ({', '.join(names)}) gone in {took:.1f} s]")
        assert not left, [(p.pid, p.name()) for p in left]
        shm_took, shm = gone_within(10, lambda: shm_files([build_dir]))
        ports_took, ports = gone_within(10, lambda: bound_ports([http, grpc, metrics, gateway, ops]))
        print(f"[its /dev/shm files gone {shm_took:.1f} s later, its ports free {ports_took:.1f} s later]")
        assert not shm, shm
        assert not ports, ports
        assert not ours(build_dir), [(p.pid, p.name()) for p in ours(build_dir)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for process in tree:  # whatever the test found alive: never left to the next test
            try:
                process.kill()
            except psutil.Error:
                pass
