"""`python -m serving serve --replicas 2`: two real tritonservers on the +10
port layout, each with its own work dir and a share of the cores, both
answering the inference probe exactly as its golden file says, one gateway
given both replicas and the golden file; a replica killed under traffic is
restarted by serve and routed to again; and everything gone within 10 s of
Ctrl-C after a cancelled stream, the gateway stopped first."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
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
from tests.e2e.serve_process import (
    api_key,
    bound_ports,
    follow,
    hang_up_a_stream,
    read_until_banner,
    shm_files,
    stop_with_ctrl_c,
)

pytestmark = pytest.mark.e2e

REPLICAS = 2


@dataclass
class Fleet:
    proc: subprocess.Popen[str]
    build_dir: Path
    layout: list[Ports]
    gateway: int
    ops: int  # the gateway's /metrics
    supervisor: int  # serve's own /metrics (serving_replica_restarts_total)
    started_s: float = 0.0
    output: list[str] = field(default_factory=list)

    def metric(self, port: int, name: str, **labels: str) -> float:
        """A sample summed over the series that carry `labels` (0 when none)."""
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name + "{") and all(w in line for w in wanted)
        )

    @property
    def text(self) -> str:
        return "".join(self.output)


@pytest.fixture(scope="module")
def fleet(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    build_dir = tmp_path_factory.mktemp("serve-replicas")
    base = free_base_ports(REPLICAS)
    layout = replica_ports(base, REPLICAS)
    taken = {p for ports in layout for p in ports.all()}
    gateway, ops, supervisor = [p for p in free_local_ports(6) if p not in taken][:3]
    env = {**os.environ, "LLM_BUILD_DIR": str(build_dir), "LLM_MODEL_DIR": str(model_dir)}
    env.pop(ADMIN_KEY_ENV, None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "serving",
            "serve",
            "--replicas",
            str(REPLICAS),
            "--http-port",
            str(base.http),
            "--grpc-port",
            str(base.grpc),
            "--metrics-port",
            str(base.metrics),
            "--set",
            f"gateway.port={gateway}",
            "--set",
            "gateway.public_grpc_port=0",
            "--set",
            f"gateway.ops_port={ops}",
            "--set",
            f"server.supervisor_metrics_port={supervisor}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    started = Fleet(proc, build_dir, layout, gateway, ops, supervisor)
    try:
        read_until_banner(proc, started.output, 300)
        started.started_s = time.monotonic() - t0
        print(f"\n[{REPLICAS} replicas + gateway ready in {started.started_s:.1f} s]")
        assert "ready." in started.text, started.text
        follow(proc, started.output)  # the supervisor's lines and the stop's, for the tests below
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
        config = fleet.build_dir / "replicas" / f"r{i}" / "model_repository" / "python_llm" / "config.pbtxt"
        block = config.read_text().split('key: "num_threads"', 1)[1][:80]
        assert f'string_value: "{threads}"' in block, block


def test_each_replica_is_ready_and_answers_the_probe_as_the_golden_says(fleet: Fleet, model_dir: Path):
    path = golden_path(model_dir, fleet.build_dir)
    assert f"golden answer in {path}" in fleet.text
    golden = load_golden(path)

    async def ready(ports: Ports) -> tuple[bool, bool]:
        async with (
            AsyncLLMClient(ClientConfig(url=f"127.0.0.1:{ports.grpc}", transport="grpc")) as grpc,
            AsyncLLMClient(ClientConfig(url=f"http://127.0.0.1:{ports.http}")) as sse,
        ):
            return await grpc.ready(), await sse.ready()

    for ports in fleet.layout:
        assert asyncio.run(ready(ports)) == (True, True)
        t0 = time.monotonic()
        answer = httpx.post(
            f"http://127.0.0.1:{ports.http}/v2/models/{golden.model}/generate",
            timeout=120,
            json={"text_input": golden.prompt, **golden.request},
        )
        assert answer.status_code == 200, answer.text
        body = answer.json()
        print(f"[probe on :{ports.http} answered in {time.monotonic() - t0:.2f} s: {body['text_output']!r}]")
        assert body["output_ids"] == list(golden.output_ids)
        assert body["text_output"] == golden.text


def test_the_gateway_is_up_and_given_both_replicas_and_the_golden(fleet: Fleet, model_dir: Path):
    assert httpx.get(f"http://127.0.0.1:{fleet.gateway}/health", timeout=10).status_code == 200
    (gateway,) = [
        p for p in psutil.Process(fleet.proc.pid).children(recursive=True) if "gateway" in " ".join(p.cmdline())
    ]
    cmdline = gateway.cmdline()
    settings = dict(cmdline[i + 1].split("=", 1) for i, arg in enumerate(cmdline) if arg == "--set")
    assert json.loads(settings["gateway.fleet.replicas"]) == {
        f"r{i}": {"grpc_url": f"127.0.0.1:{ports.grpc}", "metrics_url": f"http://127.0.0.1:{ports.metrics}/metrics"}
        for i, ports in enumerate(fleet.layout)
    }
    assert settings["gateway.fleet.probe_golden_file"] == str(golden_path(model_dir, fleet.build_dir))


def _tritonserver(fleet: Fleet, replica: str) -> psutil.Process | None:
    work = f"{fleet.build_dir / 'replicas' / replica}/"
    for process in psutil.Process(fleet.proc.pid).children(recursive=True):
        try:
            if process.name() == "tritonserver" and work in " ".join(process.cmdline()):
                return process
        except psutil.Error:
            continue
    return None


def _wait(bound_s: float, what: str, predicate, explain=lambda: "") -> float:
    t0 = time.monotonic()
    while not predicate():
        if time.monotonic() - t0 > bound_s:
            raise AssertionError(f"{what}: not within {bound_s:.0f} s\n{explain()}")
        time.sleep(0.2)
    return time.monotonic() - t0


def test_a_replica_killed_under_traffic_is_restarted_and_routed_to_again(fleet: Fleet):
    key = api_key(fleet.text)
    routed = lambda: fleet.metric(fleet.ops, "gateway_routed_total", replica="r1")  # noqa: E731
    routable = lambda: fleet.metric(fleet.ops, "gateway_replica_routable", replica="r1") == 1.0  # noqa: E731
    _wait(120, "r1 routable before the kill", routable)
    outcomes: list[int | str] = []
    going = threading.Event()
    going.set()

    def traffic() -> None:  # short greedy completions, back to back, until told to stop
        with httpx.Client(timeout=httpx.Timeout(30.0, read=120.0)) as client:
            while going.is_set():
                try:
                    answer = client.post(
                        f"http://127.0.0.1:{fleet.gateway}/v1/completions",
                        headers={"Authorization": f"Bearer {key}"},
                        json={"model": "ensemble", "prompt": "Count: 1, 2, 3,", "max_tokens": 8, "temperature": 0},
                    )
                    outcomes.append(answer.status_code)
                except httpx.HTTPError as exc:
                    outcomes.append(repr(exc))

    senders = [threading.Thread(target=traffic, daemon=True) for _ in range(2)]
    for sender in senders:
        sender.start()
    try:
        _wait(60, "traffic flowing", lambda: len(outcomes) >= 2)
        old = _tritonserver(fleet, "r1")
        assert old is not None
        stubs = old.children()
        killed = time.monotonic()
        old.send_signal(signal.SIGKILL)  # a crash: the server alone, not its group
        _wait(
            240,
            "r1 restarted by serve",
            lambda: "replica r1: restarted, ready in" in fleet.text,
            lambda: fleet.text[-3000:],
        )
        restarted_s = time.monotonic() - killed
        back_s = _wait(240, "r1 routable again", routable) + restarted_s
        before = routed()
        _wait(120, "a request routed to the restarted r1", lambda: routed() > before)
        routed_s = time.monotonic() - killed
    finally:
        going.clear()
        for sender in senders:
            sender.join(150)
    new = _tritonserver(fleet, "r1")
    refused = [o for o in outcomes if o != 200]
    print(
        f"\n[kill -9 of r1's tritonserver under traffic: restarted (ready) {restarted_s:.1f} s later, routable "
        f"again {back_s:.1f} s later, first request routed to it {routed_s:.1f} s later; {len(outcomes)} "
        f"requests, {len(refused)} not 200: {refused[:5]}]"
    )
    assert new is not None and new.pid != old.pid
    assert "replica r1: tritonserver exited on its own (killed by SIGKILL); restarting it in" in fleet.text
    assert fleet.metric(fleet.supervisor, "serving_replica_restarts_total", replica="r1", cause="SIGKILL") == 1
    assert fleet.metric(fleet.supervisor, "serving_replica_up", replica="r1") == 1
    assert not [p for p in stubs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE], "the old stubs live on"


def test_ctrl_c_stops_the_gateway_first_then_every_replica_within_10_s(fleet: Fleet):
    tree = psutil.Process(fleet.proc.pid).children(recursive=True)
    tritons = [p for p in tree if p.name() == "tritonserver"]
    assert len(tritons) == REPLICAS, [(p.pid, p.name()) for p in tree]
    hung_up = hang_up_a_stream(fleet.gateway, api_key(fleet.text))
    mark = len(fleet.output)
    t0 = time.monotonic()
    stop_with_ctrl_c(fleet.proc, 90)
    took = time.monotonic() - t0
    time.sleep(0.5)  # the follower's last lines
    rest = "".join(fleet.output[mark:])
    print(
        f"[a stream hung up after {hung_up:.1f} s; serve --replicas {REPLICAS} stopped {took:.1f} s after "
        f"Ctrl-C; {len(tree)} processes checked]\n{rest}"
    )
    assert fleet.proc.returncode == 0, fleet.text
    assert rest.index("stopping the gateway...") < rest.index(f"stopping {REPLICAS} tritonservers..."), rest
    assert "stopped (exit codes r0 " in rest, rest
    assert took <= 10.0, f"Ctrl-C took {took:.1f} s (bound 10 s)\n{rest}"
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, [(p.pid, p.name()) for p in alive]
    assert not shm_files([fleet.build_dir / "replicas" / f"r{i}" for i in range(REPLICAS)])
    assert not bound_ports(
        [p for ports in fleet.layout for p in ports.all()] + [fleet.gateway, fleet.ops, fleet.supervisor]
    )
