"""`python -m serving serve --replicas 2`: two real tritonservers on the +10
port layout, each with its own work dir and a share of the cores, both
answering the inference probe exactly as its golden file says, one gateway
given both replicas and the golden file, and everything gone after Ctrl-C,
the gateway stopped first."""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil
import pytest

from client import AsyncLLMClient, ClientConfig
from serving.fleet import Ports, free_base_ports, replica_ports, thread_budget, usable_cores
from serving.launcher import ADMIN_KEY_ENV, free_local_ports
from serving.probe_golden import golden_path, load_golden

from .serve_process import read_until_banner, stop_with_ctrl_c

pytestmark = pytest.mark.e2e

REPLICAS = 2


@dataclass
class Fleet:
    proc: subprocess.Popen[str]
    build_dir: Path
    layout: list[Ports]
    gateway: int
    started_s: float = 0.0
    output: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return "".join(self.output)


@pytest.fixture(scope="module")
def fleet(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    build_dir = tmp_path_factory.mktemp("serve-replicas")
    base = free_base_ports(REPLICAS)
    layout = replica_ports(base, REPLICAS)
    taken = {p for ports in layout for p in ports.all()}
    gateway, ops = [p for p in free_local_ports(6) if p not in taken][:2]
    env = {**os.environ, "LLM_BUILD_DIR": str(build_dir), "LLM_MODEL_DIR": str(model_dir)}
    env.pop(ADMIN_KEY_ENV, None)
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "serving", "serve", "--replicas", str(REPLICAS),
                             "--http-port", str(base.http), "--grpc-port", str(base.grpc),
                             "--metrics-port", str(base.metrics),
                             "--set", f"gateway.port={gateway}", "--set", "gateway.public_grpc_port=0",
                             "--set", f"gateway.ops_port={ops}"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    started = Fleet(proc, build_dir, layout, gateway)
    try:
        read_until_banner(proc, started.output, 300)
        started.started_s = time.monotonic() - t0
        print(f"\n[{REPLICAS} replicas + gateway ready in {started.started_s:.1f} s]")
        assert "ready." in started.text, started.text
        yield started
    finally:
        stop_with_ctrl_c(proc, 90)


def test_the_banner_lists_every_replica_and_its_thread_share(fleet: Fleet):
    threads = thread_budget(REPLICAS, usable_cores())
    assert f"{REPLICAS} replicas, engine.num_threads={threads} each" in fleet.text, fleet.text
    for i, ports in enumerate(fleet.layout):
        assert f"r{i} ready in " in fleet.text
        assert f"  r{i}   HTTP     http://127.0.0.1:{ports.http}" in fleet.text, fleet.text
        assert f"gRPC     127.0.0.1:{ports.grpc}" in fleet.text
        assert f"admin    key in {fleet.build_dir / 'replicas' / f'r{i}' / 'admin_key'}" in fleet.text
        config = (fleet.build_dir / "replicas" / f"r{i}" / "model_repository" / "python_llm" / "config.pbtxt")
        block = config.read_text().split('key: "num_threads"', 1)[1][:80]
        assert f'string_value: "{threads}"' in block, block


def test_each_replica_is_ready_and_answers_the_probe_as_the_golden_says(fleet: Fleet, model_dir: Path):
    path = golden_path(model_dir, fleet.build_dir)
    assert f"golden answer in {path}" in fleet.text
    golden = load_golden(path)

    async def ready(ports: Ports) -> tuple[bool, bool]:
        async with AsyncLLMClient(ClientConfig(url=f"127.0.0.1:{ports.grpc}", transport="grpc")) as grpc, \
                AsyncLLMClient(ClientConfig(url=f"http://127.0.0.1:{ports.http}")) as sse:
            return await grpc.ready(), await sse.ready()

    for ports in fleet.layout:
        assert asyncio.run(ready(ports)) == (True, True)
        t0 = time.monotonic()
        answer = httpx.post(f"http://127.0.0.1:{ports.http}/v2/models/{golden.model}/generate", timeout=120,
                            json={"text_input": golden.prompt, **golden.request})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        print(f"[probe on :{ports.http} answered in {time.monotonic() - t0:.2f} s: {body['text_output']!r}]")
        assert body["output_ids"] == list(golden.output_ids)
        assert body["text_output"] == golden.text


def test_the_gateway_is_up_and_given_both_replicas_and_the_golden(fleet: Fleet, model_dir: Path):
    assert httpx.get(f"http://127.0.0.1:{fleet.gateway}/health", timeout=10).status_code == 200
    (gateway,) = [p for p in psutil.Process(fleet.proc.pid).children(recursive=True)
                  if "gateway" in " ".join(p.cmdline())]
    cmdline = gateway.cmdline()
    settings = dict(cmdline[i + 1].split("=", 1) for i, arg in enumerate(cmdline) if arg == "--set")
    assert json.loads(settings["gateway.replicas"]) == {
        f"r{i}": {"grpc_url": f"127.0.0.1:{ports.grpc}", "metrics_url": f"http://127.0.0.1:{ports.metrics}/metrics"}
        for i, ports in enumerate(fleet.layout)}
    assert settings["gateway.probe_golden_file"] == str(golden_path(model_dir, fleet.build_dir))


def test_ctrl_c_stops_the_gateway_first_then_every_replica(fleet: Fleet):
    tree = psutil.Process(fleet.proc.pid).children(recursive=True)
    tritons = [p for p in tree if p.name() == "tritonserver"]
    assert len(tritons) == REPLICAS, [(p.pid, p.name()) for p in tree]
    t0 = time.monotonic()
    stop_with_ctrl_c(fleet.proc, 90)
    print(f"[serve --replicas {REPLICAS} stopped in {time.monotonic() - t0:.1f} s; "
          f"{len(tree)} processes checked]")
    rest = fleet.proc.stdout.read()
    assert fleet.proc.returncode == 0, fleet.text + rest
    assert rest.index("stopping the gateway...") < rest.index(f"stopping {REPLICAS} tritonservers..."), rest
    assert "stopped (exit codes r0 0, r1 0)." in rest, rest
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, [(p.pid, p.name()) for p in alive]
