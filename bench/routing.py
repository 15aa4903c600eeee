"""Routing policies compared on one workload: two tritonservers behind the
gateway, round_robin vs least_load vs prefix_aware (issue 14).

`python -m bench.routing` starts, for each policy in turn, two fresh
tritonservers (free ports, `engine.num_threads=1` each so they share the two
cores, a KV budget of `--kv-tokens` tokens each: the tenants' system prompts
do not all fit in one replica's cache, they do across both) and a gateway in
front of them with that policy; the servers are restarted between policies,
so every policy starts with cold prefix caches. Each replica gets one short
unrelated warm-up request straight over gRPC (not counted, no shared prefix).

The workload (bench/routing_workload.py): tenants with a long system prompt
each, several users per tenant in multi-turn conversations (every turn sends
the conversation so far plus a new question, with the answers the model gave;
the request's `user` is the conversation), sent through the gateway's OpenAI
chat API at a fixed concurrency, streamed, greedy, short answers. The same
seed gives the same turns in the same order for every policy.

Measured per policy: TTFT (to the first content chunk) p50 / p90, output
tokens/s and requests/s over the run's wall time; per replica the requests
the gateway sent it (`gateway_routed_total`) and its prefix-cache hit rate:
the delta of Triton's `llm_prefix_cache_hit_tokens_total` over the delta of
`llm_prompt_tokens_total` (the engine's prompt tokens of admitted requests).

A smoke run (one policy, a few turns, under a minute on 2 cores):
  python -m bench.routing --policies prefix_aware --turns 8 --concurrency 4"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from bench.report import MachineInfo
from bench.routing_workload import Turn, Workload, WorkloadSpec, make_workload
from client import AsyncLLMClient, ClientConfig, RetryConfig
from contract import metric_names as m
from gateway.admission.keys import KeyStore
from gateway.config import ROUTING_POLICIES
from serving.gateway_process import GatewayProcess
from serving.launcher import LaunchOptions, TritonServer, free_local_ports
from serving.settings import DeploymentSettings

_ENGINE = (m.PROMPT_TOKENS, m.PREFIX_CACHE_HIT_TOKENS, m.PREEMPTIONS, m.KV_BLOCKS_CAPACITY)
REPLICAS = ("r0", "r1")


def scrape(text: str, names: tuple[str, ...]) -> dict[str, float]:
    """Sum of every sample named in `names` (over its label sets)."""
    values = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in values:
                values[sample.name] += sample.value
    return values


def routed(text: str) -> dict[str, dict[str, float]]:
    """gateway_routed_total by replica, then by reason."""
    table: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "gateway_routed_total":
                by = table.setdefault(sample.labels["replica"], {})
                by[sample.labels["reason"]] = by.get(sample.labels["reason"], 0.0) + sample.value
    return table


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = q * (len(ordered) - 1)
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def one_turn(
    http: httpx.AsyncClient, messages: list[dict[str, str]], user: str, max_tokens: int
) -> tuple[float, str, int, int]:
    """(TTFT s, answer, prompt tokens, completion tokens) of one streamed chat request."""
    body = {
        "model": "ensemble",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "user": user,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, parts = None, []
    usage: dict[str, int] = {}
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"{response.status_code}: {(await response.aread()).decode()[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", ()):
                text = (choice.get("delta") or {}).get("content")
                if text:
                    parts.append(text)
                    if first is None:
                        first = time.perf_counter() - started
    ended = time.perf_counter() - started
    return (
        (first if first is not None else ended),
        "".join(parts),
        usage.get("prompt_tokens", 0),
        usage.get("completion_tokens", 0),
    )


async def run_workload(
    workload: Workload, gateway_url: str, key: str, concurrency: int, max_tokens: int
) -> dict[str, Any]:
    """Workers take the turns in their fixed order; a turn waits for its
    conversation's previous turn (it needs that answer)."""
    answers: dict[str, list[str]] = {}
    finished = {t.index: asyncio.Event() for t in workload.turns}
    previous: dict[int, int] = {}
    last: dict[str, int] = {}
    for t in workload.turns:
        if t.conversation in last:
            previous[t.index] = last[t.conversation]
        last[t.conversation] = t.index
    queue = list(workload.turns)[::-1]
    ttft: list[float] = []
    totals = {"prompt_tokens": 0, "completion_tokens": 0, "requests": 0}

    async def worker(http: httpx.AsyncClient) -> None:
        while queue:
            turn: Turn = queue.pop()
            if turn.index in previous:
                await finished[previous[turn.index]].wait()
            history = answers.setdefault(turn.conversation, [])
            first, answer, prompt, completion = await one_turn(
                http, workload.messages(turn, history), turn.conversation, max_tokens
            )
            history.append(answer)
            ttft.append(first)
            totals["prompt_tokens"] += prompt
            totals["completion_tokens"] += completion
            totals["requests"] += 1
            finished[turn.index].set()
            print(f"\r  {totals['requests']}/{len(workload.turns)} turns", end="", file=sys.stderr, flush=True)

    limits = httpx.Limits(max_connections=concurrency * 2, max_keepalive_connections=concurrency * 2)
    async with httpx.AsyncClient(
        base_url=gateway_url, headers={"Authorization": f"Bearer {key}"}, limits=limits, timeout=httpx.Timeout(600.0)
    ) as http:
        started = time.perf_counter()
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))
        wall = time.perf_counter() - started
    print(file=sys.stderr)
    return {"wall_s": round(wall, 2), **totals, "ttft_s": ttft}


async def warm_up(grpc_url: str) -> None:
    config = ClientConfig(url=grpc_url, transport="grpc", retry=RetryConfig(max_attempts=1))
    async with AsyncLLMClient(config) as client:
        async for _ in client.stream(
            "", messages=[{"role": "user", "content": "Count to five."}], max_tokens=4, temperature=0.0
        ):
            pass


def others_running(ours: set[int]) -> list[int]:
    found = subprocess.run(["pgrep", "-x", "tritonserver"], capture_output=True, text=True).stdout.split()
    return [int(pid) for pid in found if int(pid) not in ours]


class MachineWatch:
    """While a policy runs, every few seconds: the 1-minute load average and
    whether someone else's tritonserver is running (a shared machine)."""

    def __init__(self, ours: set[int], every_s: float = 5.0) -> None:
        self.ours, self.every_s = ours, every_s
        self.loads: list[float] = []
        self.others: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.loads.append(os.getloadavg()[0])
            self.others.update(others_running(self.ours))

    def __enter__(self) -> MachineWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self) -> dict[str, Any]:
        return {
            "load_1min_mean_during": round(statistics.mean(self.loads), 2) if self.loads else None,
            "other_tritonservers_during": sorted(self.others),
        }


def run_policy(
    policy: str, settings: DeploymentSettings, workload: Workload, args: argparse.Namespace, work: Path
) -> dict[str, Any]:
    work = work / policy
    servers: dict[str, TritonServer] = {}
    for name in REPLICAS:
        http_port, grpc_port, metrics_port = free_local_ports(3)
        servers[name] = TritonServer(
            LaunchOptions(
                settings=settings,
                http_port=http_port,
                grpc_port=grpc_port,
                metrics_port=metrics_port,
                address="127.0.0.1",
                work_dir=work / name,
                ready_timeout_s=600,
            )
        )
    gateway_port = free_local_ports(1)[0]
    keys = work / "keys.json"
    work.mkdir(parents=True, exist_ok=True)
    key = KeyStore(keys).create("bench", label="bench").key
    tiers = '{"bench": {"priority": 0, "max_concurrent_requests": 0}}'  # no limits: measure the routing
    replicas = json.dumps({name: {"grpc_url": s.grpc_url, "metrics_url": s.metrics_url} for name, s in servers.items()})
    gateway = GatewayProcess(
        [
            f"gateway.port={gateway_port}",
            "gateway.host=127.0.0.1",
            f"gateway.fleet.replicas={replicas}",
            f"gateway.fleet.routing_policy={policy}",
            f"gateway.keys_file={keys}",
            f"gateway.tiers={tiers}",
            "gateway.limits.max_concurrent_requests=4096",
            "gateway.public_grpc_port=0",
        ],
        log_path=work / "gateway.log",
        port=gateway_port,
    )
    try:
        with ThreadPoolExecutor(len(servers)) as pool:  # both start at once; a failure stops both below
            for future in [pool.submit(s.start) for s in servers.values()]:
                future.result()
        for server in servers.values():
            asyncio.run(warm_up(server.grpc_url))
        gateway.start()
        time.sleep(2.0)  # a few metrics scrapes: the load is known
        others = others_running({s.pid for s in servers.values()})
        before = {name: scrape(httpx.get(s.metrics_url).text, _ENGINE) for name, s in servers.items()}
        load_before = os.getloadavg()[0]
        print(
            f"{policy}: {len(workload.turns)} turns at concurrency {args.concurrency} "
            f"(load {load_before:.2f}{', other tritonservers: ' + str(others) if others else ''})",
            flush=True,
        )
        with MachineWatch({s.pid for s in servers.values()}) as watch:
            watch.others.update(others)
            result = asyncio.run(
                run_workload(workload, f"http://127.0.0.1:{gateway_port}", key, args.concurrency, args.max_tokens)
            )
        after = {name: scrape(httpx.get(s.metrics_url).text, _ENGINE) for name, s in servers.items()}
        sent = routed(httpx.get(str(gateway.metrics_url)).text)  # the ops port: /metrics is not public
    finally:
        gateway.stop()
        for server in servers.values():
            server.stop()
    ttft = result.pop("ttft_s")
    per_replica: dict[str, dict[str, Any]] = {}
    for name in REPLICAS:
        delta = {k: after[name][k] - before[name][k] for k in _ENGINE}
        prompt = delta[m.PROMPT_TOKENS]
        per_replica[name] = {
            "requests": int(sum(sent.get(name, {}).values())),
            "routed_by_reason": sent.get(name, {}),
            "prompt_tokens": int(prompt),
            "prefix_hit_tokens": int(delta[m.PREFIX_CACHE_HIT_TOKENS]),
            "prefix_hit_rate": round(delta[m.PREFIX_CACHE_HIT_TOKENS] / prompt, 4) if prompt else None,
            "preemptions": int(delta[m.PREEMPTIONS]),
            "kv_blocks": int(after[name][m.KV_BLOCKS_CAPACITY]),
        }
    hits = sum(r["prefix_hit_tokens"] for r in per_replica.values())
    prompts = sum(r["prompt_tokens"] for r in per_replica.values())
    return {
        "policy": policy,
        **result,
        "load_1min_before": load_before,
        "load_1min_after": os.getloadavg()[0],
        "other_tritonservers_at_start": others,
        **watch.summary(),
        "ttft_p50_ms": round(1000 * percentile(ttft, 0.5), 1),
        "ttft_p90_ms": round(1000 * percentile(ttft, 0.9), 1),
        "ttft_mean_ms": round(1000 * statistics.mean(ttft), 1),
        "output_tok_s": round(result["completion_tokens"] / result["wall_s"], 2),
        "requests_s": round(result["requests"] / result["wall_s"], 3),
        "prefix_hit_rate": round(hits / prompts, 4) if prompts else None,
        "replicas": per_replica,
        "ttft_ms": [round(1000 * x, 1) for x in ttft],
    }


def print_table(console: Console, rows: list[dict[str, Any]]) -> None:
    table = Table(title="routing policies: 2 replicas, multi-tenant multi-turn chat")
    for column in (
        "policy",
        "TTFT p50",
        "TTFT p90",
        "output tok/s",
        "requests/s",
        "prefix hit rate (all)",
        *(f"{r}: requests / hit rate / preempt." for r in REPLICAS),
        "wall s",
        "load during",
    ):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in rows:
        cells = [
            f"{row['replicas'][r]['requests']} / {row['replicas'][r]['prefix_hit_rate'] or 0:.1%} / "
            f"{row['replicas'][r]['preemptions']}"
            for r in REPLICAS
        ]
        table.add_row(
            row["policy"],
            f"{row['ttft_p50_ms']:.0f} ms",
            f"{row['ttft_p90_ms']:.0f} ms",
            f"{row['output_tok_s']:.2f}",
            f"{row['requests_s']:.3f}",
            f"{(row['prefix_hit_rate'] or 0):.1%}",
            *cells,
            f"{row['wall_s']:.1f}",
            f"{row['load_1min_mean_during'] or 0:.2f}" + (" *" if row["other_tritonservers_during"] else ""),
        )
    console.print(table)
    if any(row["other_tritonservers_during"] for row in rows):
        console.print("* someone else's tritonserver ran during that policy: its numbers are slowed")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.routing", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policies", default=",".join(ROUTING_POLICIES), help="comma-separated, run in this order")
    parser.add_argument("--turns", type=int, default=WorkloadSpec.turns, help="turns (requests) in total per policy")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--tenants", type=int, default=4)
    parser.add_argument("--users-per-tenant", type=int, default=4)
    parser.add_argument("--system-words", type=int, default=WorkloadSpec.system_words)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--kv-tokens", type=int, default=2560, help="engine.max_tokens_in_paged_kv_cache of each replica"
    )
    parser.add_argument("--seed", type=int, default=WorkloadSpec.seed)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="more deployment settings for both tritonservers",
    )
    parser.add_argument("--out", metavar="FILE", help="write the results here as JSON")
    args = parser.parse_args(argv)
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies or set(policies) - set(ROUTING_POLICIES):
        parser.error(f"--policies: from {', '.join(ROUTING_POLICIES)}")
    if args.turns <= 0 or args.concurrency <= 0:
        parser.error("--turns and --concurrency must be > 0")
    spec = WorkloadSpec(
        tenants=args.tenants,
        users_per_tenant=args.users_per_tenant,
        turns=args.turns,
        system_words=args.system_words,
        seed=args.seed,
    )
    workload = make_workload(spec)
    from serving.default_model import resolve_model_dir

    settings = DeploymentSettings.load(
        assignments=["engine.num_threads=1", f"engine.max_tokens_in_paged_kv_cache={args.kv_tokens}", *args.set],
        default_model_dir=lambda: str(resolve_model_dir(None)),
    )
    console = Console(width=None if sys.stdout.isatty() else 150)
    machine = MachineInfo.collect(torch_threads=settings.engine.num_threads)
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "bench.routing", *(argv or sys.argv[1:])])
    console.print(f"machine: {machine.line()}")
    console.print(
        f"workload: {spec.tenants} tenants x {spec.users_per_tenant} users, {spec.turns} turns, "
        f"system prompts of {spec.system_words} words, max_tokens {args.max_tokens}, concurrency "
        f"{args.concurrency}; KV {args.kv_tokens} tokens per replica"
    )
    work = Path(tempfile.mkdtemp(prefix="bench-routing-"))
    rows = [run_policy(policy, settings, workload, args, work) for policy in policies]
    print_table(console, rows)
    if args.out:
        record = {
            "command": command,
            "machine": vars(machine),
            "workload": {
                "tenants": spec.tenants,
                "users_per_tenant": spec.users_per_tenant,
                "turns": spec.turns,
                "system_words": spec.system_words,
                "system_chars": {t: len(p) for t, p in workload.system_prompts.items()},
                "seed": spec.seed,
                "concurrency": args.concurrency,
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "stream": True,
            },
            "replicas": {
                "count": len(REPLICAS),
                "engine.num_threads": settings.engine.num_threads,
                "engine.max_tokens_in_paged_kv_cache": settings.engine.max_tokens_in_paged_kv_cache,
                "engine.block_size": settings.engine.block_size,
                "reset": "restarted per policy",
                "settings": args.set,
            },
            "results": rows,
        }
        Path(args.out).write_text(json.dumps(record, indent=2))
        console.print(f"written: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
