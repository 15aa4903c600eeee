"""Helpers for the replica e2e tests: a gateway over several real
tritonservers, concurrent streamed requests with their timings, the
gateway's replica metrics, crashing / hanging a replica, and a copy of the
model with one weight tensor corrupted."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from gateway.admission.keys import KeyStore
from serving.gateway_process import GatewayProcess
from serving.launcher import TritonServer, free_local_ports
from tests.e2e.triton_calls import scrape_metrics

# the modules that log failed engine requests: the error mapping and a replica's connection
_UPSTREAM_LOGGERS = re.compile(r'"logger": "gateway\.(core\.upstream|fleet\.replica_client)"')
FLEET_SETTINGS = [
    "gateway.fleet.probe_interval_s=1",
    "gateway.fleet.probe_timeout_s=15",
    "gateway.fleet.eject_after_failures=2",
    "gateway.fleet.readmit_after_successes=2",
    "gateway.fleet.eject_backoff_s=2",
    "gateway.fleet.metrics_interval_s=0.25",
    "gateway.fleet.metrics_stale_s=1.5",
    "gateway.public_grpc_port=0",
    "gateway.drain_timeout_s=60",
]


@dataclass
class FleetGateway:
    process: GatewayProcess
    url: str
    key: str  # a paid-tier key
    admin_key: str
    free_key: str = ""

    def metric(self, name: str, replica: str) -> float:
        text = httpx.get(self.process.metrics_url, timeout=10).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name + "{") and f'replica="{replica}"' in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def routable(self, replica: str) -> bool:
        return self.metric("gateway_replica_routable", replica) == 1.0

    def routed(self, replica: str) -> float:
        return self.metric("gateway_routed_total", replica)

    def upstream_warnings(self) -> list[str]:
        """What the gateway logged about failed engine requests: the cause a
        failed test should show (the log itself is gone after a CI run)."""
        lines = self.process.log_path.read_text(errors="replace").splitlines()
        return [line[:300] for line in lines if _UPSTREAM_LOGGERS.search(line) and '"WARNING"' in line]

    def fleet_report(self) -> str:
        """Why a replica is or is not routable, as the gateway saw it: its
        probe outcomes and its last warnings (a failed wait shows them; the
        log is gone after a CI run)."""
        try:
            text = httpx.get(self.process.metrics_url, timeout=10).text
            probes = [line for line in text.splitlines() if line.startswith("gateway_replica_probes_total{")]
        except httpx.HTTPError as exc:  # the report must not hide the failure it explains
            probes = [f"the gateway's /metrics did not answer: {exc!r} (alive: {self.process.alive()})"]
        lines = self.process.log_path.read_text(errors="replace").splitlines()
        warnings = [line[:300] for line in lines if '"level": "WARNING"' in line or '"level": "ERROR"' in line]
        return "\n".join(["probe outcomes:", *probes, "last warnings:", *warnings[-20:]])

    def wait_routable(self, bound_s: float, **wanted: bool) -> float:
        """Seconds until each named replica's routable state is as wanted,
        e.g. `wait_routable(120, r0=True, r1=True)`; past the bound, fails
        with the gateway's report."""
        return wait_until(
            lambda: all(self.routable(name) == state for name, state in wanted.items()),
            bound_s,
            f"routable {wanted}",
            explain=self.fleet_report,
        )

    def total(self, name: str, **labels: str) -> float:
        """A metric summed over the series that carry `labels`."""
        wanted = [f'{k}="{v}"' for k, v in labels.items()]
        text = httpx.get(self.process.metrics_url, timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith(name + "_created") and all(w in line for w in wanted)
        )


def start_fleet_gateway(replicas: dict[str, TritonServer], work: Path, golden: Path, *extra: str) -> FleetGateway:
    (port,) = free_local_ports(1)
    store = KeyStore(work / "keys.json")
    key = store.create("paid", label="fleet").key
    free_key = store.create("free", label="fleet-free").key
    admin_key_file = work / "admin_key"
    admin_key_file.write_text("fleet-admin-key-for-tests-0123456789")
    spec = {name: {"grpc_url": server.grpc_url, "metrics_url": server.metrics_url} for name, server in replicas.items()}
    process = GatewayProcess(
        [
            f"gateway.port={port}",
            "gateway.host=127.0.0.1",
            f"gateway.keys_file={store.path}",
            f"gateway.fleet.replicas={json.dumps(spec)}",
            f"gateway.fleet.probe_golden_file={golden}",
            f"gateway.admin_key_file={admin_key_file}",
            *FLEET_SETTINGS,
            *extra,
        ],
        log_path=work / "gateway.log",
        port=port,
    )
    process.start()
    return FleetGateway(process, f"http://127.0.0.1:{port}", key, admin_key_file.read_text(), free_key)


def wait_until(predicate, bound_s: float, what: str, explain: Callable[[], str] | None = None) -> float:
    started = time.monotonic()
    while not predicate():
        if time.monotonic() - started > bound_s:
            raise AssertionError(f"{what}: not within {bound_s} s" + (f"\n{explain()}" if explain else ""))
        time.sleep(0.1)
    return time.monotonic() - started


@dataclass
class StreamOutcome:
    sent_s: float
    status: int | None = None
    first_content_s: float | None = None
    done: bool = False
    error: str | None = None
    text: str = ""


@dataclass
class Load:
    """`count` streamed completions at once, each in its own thread."""

    gateway: FleetGateway
    count: int
    max_tokens: int = 48
    prompt: str = "Write a short story about a lighthouse."
    key: str = ""  # the gateway's paid key unless given
    outcomes: list[StreamOutcome] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> Load:
        for index in range(self.count):
            outcome = StreamOutcome(sent_s=time.monotonic())
            self.outcomes.append(outcome)
            thread = threading.Thread(target=self._one, args=(outcome, f"{self.prompt} ({index})"), daemon=True)
            thread.start()
            self.threads.append(thread)
        return self

    def _one(self, outcome: StreamOutcome, prompt: str) -> None:
        body = {
            "model": "ensemble",
            "prompt": prompt,
            "max_tokens": self.max_tokens,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        try:
            with httpx.Client(timeout=httpx.Timeout(30.0, read=120.0)) as client:
                with client.stream(
                    "POST",
                    f"{self.gateway.url}/v1/completions",
                    json=body,
                    headers={"Authorization": f"Bearer {self.key or self.gateway.key}"},
                ) as response:
                    outcome.status = response.status_code
                    if response.status_code != 200:
                        outcome.error = response.read().decode(errors="replace")[:300]
                        return
                    for line in response.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        data = line[len("data: ") :]
                        if data == "[DONE]":
                            outcome.done = True
                            return
                        event = json.loads(data)
                        if "error" in event:
                            outcome.error = json.dumps(event["error"])[:300]
                            return
                        text = event["choices"][0].get("text") or ""
                        if text and outcome.first_content_s is None:
                            outcome.first_content_s = time.monotonic()
                        outcome.text += text
        except httpx.HTTPError as exc:
            outcome.error = repr(exc)

    def wait(self, bound_s: float = 180.0) -> list[StreamOutcome]:
        for thread in self.threads:
            thread.join(bound_s)
        return self.outcomes

    def started(self) -> int:
        return sum(o.first_content_s is not None for o in self.outcomes)

    def streaming(self, min_chars: int) -> bool:
        """Whether every stream has sent at least `min_chars` of text."""
        return all(len(o.text) >= min_chars for o in self.outcomes)


def kill_group(server: TritonServer, sig: int) -> None:
    """A signal to the tritonserver and its Python stubs (one process group)."""
    if server.process is None:
        raise RuntimeError("the server is not running")
    os.killpg(server.process.pid, sig)


def corrupted_model_copy(model_dir: Path, target: Path) -> Path:
    """The model with one weight tensor scaled to nonsense: the process loads,
    reports ready, and answers wrong."""
    from safetensors.torch import load_file, save_file

    target.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, target / item.name)
    tensors = load_file(str(model_dir / "model.safetensors"))
    name = next(n for n in sorted(tensors) if n.endswith("layers.0.mlp.down_proj.weight"))
    tensors[name] = tensors[name] * -40.0
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def kv_blocks_used(server: TritonServer) -> float:
    return scrape_metrics(server.metrics_url)["llm_kv_cache_blocks_used"]


SIGKILL, SIGSTOP, SIGCONT = signal.SIGKILL, signal.SIGSTOP, signal.SIGCONT
