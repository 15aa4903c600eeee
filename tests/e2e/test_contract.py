"""The shared contract checker (`../shared/tools/check_contract.py`) passes
against a real server. The tool hard-codes Triton's default ports, so this
test starts its own server on exactly 8000/8001/8002."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from serving.launcher import LaunchOptions, TritonServer
from serving.paths import REPO_ROOT
from serving.settings import DeploymentSettings

pytestmark = pytest.mark.e2e

CONTRACT_TOOL = REPO_ROOT.parent / "shared" / "tools" / "check_contract.py"
CONTRACT_PORTS = (8000, 8001, 8002)  # HTTP, gRPC, metrics: the tool's hard-coded defaults


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


@pytest.fixture(scope="module")
def contract_server(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    if not CONTRACT_TOOL.is_file():
        pytest.fail(f"contract tool not found at {CONTRACT_TOOL}: the repository is expected next to shared/")
    taken = [p for p in CONTRACT_PORTS if _port_in_use(p)]
    if taken:
        pytest.fail(
            f"ports {taken} are in use (a `make serve` running?); the contract tool only talks to "
            f"{CONTRACT_PORTS[0]}/{CONTRACT_PORTS[2]}: stop whatever holds them and rerun"
        )
    http, grpc, metrics = CONTRACT_PORTS
    server = TritonServer(
        LaunchOptions(
            settings=DeploymentSettings.load(environ={}, model_dir=str(model_dir)),
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            address="127.0.0.1",
            work_dir=tmp_path_factory.mktemp("contract"),
            ready_timeout_s=300,
        )
    )
    t0 = time.monotonic()
    server.start()
    print(f"\n[contract tritonserver ready in {time.monotonic() - t0:.1f} s; log {server.log_path}]")
    try:
        yield server
    finally:
        server.stop()


# Triton 2.51 cannot load an ensemble with an input and an output of one name
# (see contract/public_tensors.py: ENSEMBLE_OUTPUT_NAMES), so `ensemble` echoes
# the key as `request_key_out`; docs/interface.md records the difference.
KNOWN_MISSES = {"MISS ensemble output request_key TYPE_STRING (got None)"}


def _run_tool(*flags: str) -> tuple[int, str]:
    run = subprocess.run(
        [sys.executable, str(CONTRACT_TOOL), *flags, "--host", "127.0.0.1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return run.returncode, run.stdout + run.stderr


def test_contract_tool_finds_nothing_off(contract_server):
    # on a fresh server on purpose: every metric must be exported before any request
    code, report = _run_tool("--require-bls")
    assert code == 0, report
    assert "0 finding(s) off" in report, report
    assert "MISS" not in report, report


def test_contract_tool_with_request_keys_misses_only_the_ensemble_echo(contract_server):
    code, report = _run_tool("--require-bls", "--require-request-key")
    misses = {line.strip() for line in report.splitlines() if line.startswith("MISS")}
    assert misses == KNOWN_MISSES, report
    for line in (
        "ok   ensemble input request_key TYPE_STRING (got TYPE_STRING)",
        "ok   llm_bls input request_key TYPE_STRING (got TYPE_STRING)",
        "ok   llm_bls output request_key TYPE_STRING (got TYPE_STRING)",
    ):
        assert line in report, report
    config = httpx.get(f"{contract_server.http_url}/v2/models/ensemble/config", timeout=30).json()
    outputs = {o["name"]: o["data_type"] for o in config["output"]}
    assert outputs.get("request_key_out") == "TYPE_STRING", outputs
