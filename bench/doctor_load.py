"""Loads that reproduce the three causes `serving doctor` names, on a real
tritonserver over gRPC (the client library), each with the engine settings
that make it happen:

- not_batched: engine.max_num_seqs = 1 under 8 concurrent clients;
- long_prefill: whole long prompts in one step (no chunked context, a large
  step budget) arriving every few seconds while 6 streams decode;
- kv_pressure: a KV cache of 512 tokens under 8 streams that each grow to
  ~120 tokens (preemptions).

`python -m bench.doctor_load --record DIR` records each as a trace for the
doctor's tests (tests/data/doctor/)."""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client import AsyncLLMClient, ClientConfig, GenerationOptions, RetryConfig

LONG_PROMPT = " ".join(
    f"Item {i}: the shipment of part {i * 7 % 97} left the warehouse on day {i % 28 + 1}." for i in range(40)
)  # ~820 tokens with SmolLM2's tokenizer


@dataclass(frozen=True)
class Scenario:
    name: str
    engine: dict[str, object]
    streams: int = 8
    max_tokens: int = 32
    long_prompt_every_s: float = 0.0  # 0: no long prompts
    extra: dict[str, object] = field(default_factory=dict)


SCENARIOS = {
    "not_batched": Scenario("not_batched", {"max_num_seqs": 1}),
    "long_prefill": Scenario(
        "long_prefill",
        {"enable_chunked_context": False, "max_num_batched_tokens": 4096},
        streams=6,
        max_tokens=48,
        long_prompt_every_s=4.0,
    ),
    "kv_pressure": Scenario("kv_pressure", {"max_tokens_in_paged_kv_cache": 512}, max_tokens=96),
}


async def _stream_loop(client: AsyncLLMClient, index: int, scenario: Scenario, stop: threading.Event) -> int:
    done = 0
    while not stop.is_set():
        options = GenerationOptions(max_tokens=scenario.max_tokens, temperature=0.0, ignore_eos=True)
        await client.generate(f"Client {index}, request {done}: write about the harbour at dawn.", options)
        done += 1
    return done


async def _long_prompts(client: AsyncLLMClient, scenario: Scenario, stop: threading.Event) -> int:
    sent = 0
    while not stop.is_set():
        await asyncio.sleep(scenario.long_prompt_every_s)
        # a new first line each time: the prefix cache must not serve it
        await client.generate(
            f"Report {sent} of the night shift.\n{LONG_PROMPT}", GenerationOptions(max_tokens=2, temperature=0.0)
        )
        sent += 1
    return sent


async def run_load(grpc_url: str, scenario: Scenario, stop: threading.Event) -> int:
    """Requests until `stop` is set; the number of requests finished."""
    config = ClientConfig(url=grpc_url, transport="grpc", retry=RetryConfig(max_attempts=1))
    async with AsyncLLMClient(config) as client:
        tasks = [_stream_loop(client, i, scenario, stop) for i in range(scenario.streams)]
        if scenario.long_prompt_every_s:
            tasks.append(_long_prompts(client, scenario, stop))
        return sum(await asyncio.gather(*tasks))


class BackgroundLoad:
    """`run_load` on a thread of its own, for a caller that watches meanwhile."""

    def __init__(self, grpc_url: str, scenario: Scenario) -> None:
        self.stop = threading.Event()
        self.finished = 0
        self._thread = threading.Thread(target=self._run, args=(grpc_url, scenario), daemon=True)

    def _run(self, grpc_url: str, scenario: Scenario) -> None:
        self.finished = asyncio.run(run_load(grpc_url, scenario, self.stop))

    def __enter__(self) -> BackgroundLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self._thread.join(300)


def record_all(target: Path, window_s: float, names: list[str]) -> None:
    from serving.default_model import ensure_default_model
    from serving.doctor.trace import record, save
    from serving.launcher import LaunchOptions, TritonServer, free_local_ports
    from serving.settings import DeploymentSettings

    model_dir = str(ensure_default_model())
    for scenario in (SCENARIOS[name] for name in names):
        overrides: dict[str, Any] = {f"engine.{k}": v for k, v in scenario.engine.items()}
        settings = DeploymentSettings.load(environ={}, model_dir=model_dir, **overrides)
        http, grpc, metrics = free_local_ports(3)
        server = TritonServer(
            LaunchOptions(
                settings=settings,
                http_port=http,
                grpc_port=grpc,
                metrics_port=metrics,
                address="127.0.0.1",
                work_dir=Path(tempfile.mkdtemp()),
            )
        )
        server.start()
        try:
            with BackgroundLoad(server.grpc_url, scenario) as load:
                time.sleep(3)  # past the first requests' start
                samples = record(server.metrics_url, window_s, 1.0)
            save(samples, target / f"{scenario.name}.jsonl")
            print(f"{scenario.name}: {len(samples)} scrapes, {load.finished} requests finished")
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record", type=Path, required=True, help="folder for the traces")
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("scenarios", nargs="*", choices=list(SCENARIOS), default=None)
    args = parser.parse_args()
    record_all(args.record, args.window, args.scenarios or list(SCENARIOS))


if __name__ == "__main__":
    main()
