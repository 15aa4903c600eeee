"""What the gateway costs: gRPC straight to Triton vs the gateway's OpenAI API
in front of the same Triton, interleaved and like for like.

`python -m bench.gateway` starts its own tritonserver and gateway (free
ports), then alternates the two paths round by round (direct, gateway, then
gateway, direct, ...) so that drift on a shared machine hits both alike:
  throughput  `--streams` concurrent greedy streams of `--max-tokens` tokens
              (EOS ignored), output tokens / wall time, per round;
  added TTFT  one request at a time (`--pairs` pairs, order alternating),
              time to the first content, p50 of each path and of the difference;
  overhead    the gateway's own `gateway_added_latency_seconds` (mean per phase).
Both clients are plain Python asyncio (the project's gRPC client; httpx for the
gateway's SSE), so neither side pays for an SDK the other does not."""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from client import AsyncLLMClient, ClientConfig, RetryConfig
from gateway.admission.keys import KeyStore
from serving.gateway_process import GatewayProcess
from serving.launcher import LaunchOptions, TritonServer, free_local_ports
from serving.settings import DeploymentSettings


@dataclass
class Results:
    streams: int
    max_tokens: int
    direct_tok_s: list[float] = field(default_factory=list)
    gateway_tok_s: list[float] = field(default_factory=list)
    direct_ttft_ms: list[float] = field(default_factory=list)
    gateway_ttft_ms: list[float] = field(default_factory=list)
    gateway_phase_mean_ms: dict[str, float] = field(default_factory=dict)  # over the throughput rounds
    gateway_phase_mean_ms_c1: dict[str, float] = field(default_factory=dict)  # over the TTFT pairs

    def summary(self) -> dict[str, object]:
        ratio = statistics.mean(self.gateway_tok_s) / statistics.mean(self.direct_tok_s)
        diffs = [g - d for g, d in zip(self.gateway_ttft_ms, self.direct_ttft_ms)]
        return {
            "throughput_ratio_gateway_over_direct": round(ratio, 3),
            "direct_tok_s_mean": round(statistics.mean(self.direct_tok_s), 1),
            "gateway_tok_s_mean": round(statistics.mean(self.gateway_tok_s), 1),
            "direct_ttft_p50_ms": round(statistics.median(self.direct_ttft_ms), 2),
            "gateway_ttft_p50_ms": round(statistics.median(self.gateway_ttft_ms), 2),
            "added_ttft_p50_ms": round(statistics.median(diffs), 2),
            "gateway_phase_mean_ms_throughput": self.gateway_phase_mean_ms,
            "gateway_phase_mean_ms_concurrency_1": self.gateway_phase_mean_ms_c1,
        }


def _messages(i: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Tell me a long story about the sea, number {i}."}]


async def direct_one(client: AsyncLLMClient, i: int, max_tokens: int) -> tuple[float | None, int]:
    started = time.perf_counter()
    first, tokens = None, 0
    async for event in client.stream(
        "", messages=_messages(i), max_tokens=max_tokens, temperature=0.0, ignore_eos=True
    ):
        if event.text and first is None:
            first = time.perf_counter() - started
        tokens += event.num_output_tokens or 0
    return first, tokens


async def gateway_one(http: httpx.AsyncClient, i: int, max_tokens: int) -> tuple[float | None, int]:
    body = {
        "model": "ensemble",
        "messages": _messages(i),
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first, tokens = None, 0
    async with http.stream("POST", "/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", ())):
                first = time.perf_counter() - started
    return first, tokens


async def _rate(one, streams: int, max_tokens: int, offset: int) -> float:
    started = time.perf_counter()
    counts = await asyncio.gather(*(one(offset + i, max_tokens) for i in range(streams)))
    return sum(tokens for _, tokens in counts) / (time.perf_counter() - started)


async def measure(grpc_url: str, gateway_url: str, metrics_url: str, key: str, args: argparse.Namespace) -> Results:
    """`metrics_url`: the gateway's /metrics, on its ops port (not gateway_url's)."""
    results = Results(args.streams, args.max_tokens)
    config = ClientConfig(
        url=grpc_url, transport="grpc", retry=RetryConfig(max_attempts=1), max_connections=args.streams
    )
    limits = httpx.Limits(max_connections=args.streams * 2, max_keepalive_connections=args.streams * 2)
    async with (
        AsyncLLMClient(config) as client,
        httpx.AsyncClient(
            base_url=gateway_url,
            headers={"Authorization": f"Bearer {key}"},
            limits=limits,
            timeout=httpx.Timeout(600.0),
        ) as http,
    ):
        paths = {"direct": lambda i, n: direct_one(client, i, n), "gateway": lambda i, n: gateway_one(http, i, n)}
        for name in paths:  # warm both: channels, connections, caches
            await _rate(paths[name], 4, 4, 10_000)
        for round_index in range(args.rounds):
            order = ("direct", "gateway") if round_index % 2 == 0 else ("gateway", "direct")
            for name in order:
                rate = await _rate(paths[name], args.streams, args.max_tokens, 1000 * round_index)
                getattr(results, f"{name}_tok_s").append(rate)
                print(
                    f"round {round_index + 1} {name:8s} {rate:8.1f} output tok/s at {args.streams} streams", flush=True
                )
        before = _phase_totals((await http.get(metrics_url)).text)
        results.gateway_phase_mean_ms = _means(before)
        for pair in range(args.pairs):
            order = ("direct", "gateway") if pair % 2 == 0 else ("gateway", "direct")
            for name in order:
                first, _ = await paths[name](50_000 + pair, 2)
                getattr(results, f"{name}_ttft_ms").append((first or 0.0) * 1000)
        print(
            f"TTFT at concurrency 1: direct p50 {statistics.median(results.direct_ttft_ms):.1f} ms, "
            f"gateway p50 {statistics.median(results.gateway_ttft_ms):.1f} ms",
            flush=True,
        )
        after = _phase_totals((await http.get(metrics_url)).text)
        results.gateway_phase_mean_ms_c1 = _means({key: after[key] - before.get(key, 0.0) for key in after})
    return results


def _phase_totals(metrics: str) -> dict[tuple[str, str], float]:
    """(phase, "sum" | "count") -> value of gateway_added_latency_seconds."""
    totals: dict[tuple[str, str], float] = {}
    for line in metrics.splitlines():
        for suffix in ("sum", "count"):
            prefix = f'gateway_added_latency_seconds_{suffix}{{phase="'
            if line.startswith(prefix):
                totals[(line[len(prefix) :].split('"', 1)[0], suffix)] = float(line.rsplit(" ", 1)[1])
    return totals


def _means(totals: dict[tuple[str, str], float]) -> dict[str, float]:
    return {
        phase: round(1000 * value / totals[(phase, "count")], 3)
        for (phase, kind), value in totals.items()
        if kind == "sum" and totals.get((phase, "count"))
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.gateway", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=4, help="rounds per path (interleaved)")
    parser.add_argument("--pairs", type=int, default=30, help="TTFT pairs at concurrency 1")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="deployment settings for the started stack",
    )
    parser.add_argument("--json", metavar="FILE", help="write the results here too")
    args = parser.parse_args(argv)
    from serving.default_model import resolve_model_dir

    settings = DeploymentSettings.load(assignments=args.set, default_model_dir=lambda: str(resolve_model_dir(None)))
    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    http_port, grpc_port, metrics_port, gateway_port = free_local_ports(4)
    triton = TritonServer(
        LaunchOptions(
            settings=settings,
            http_port=http_port,
            grpc_port=grpc_port,
            metrics_port=metrics_port,
            address="127.0.0.1",
            work_dir=work,
            ready_timeout_s=600,
        )
    )
    key = KeyStore(work / "keys.json").create("bench", label="bench").key
    # a tier without limits: the benchmark measures the path, not the limiter's refusals
    tiers = '{"bench": {"priority": 0, "max_concurrent_requests": 0}}'
    gateway = GatewayProcess(
        [
            f"gateway.port={gateway_port}",
            "gateway.host=127.0.0.1",
            f"gateway.fleet.upstream_grpc_url=127.0.0.1:{grpc_port}",
            f"gateway.keys_file={work / 'keys.json'}",
            f"gateway.tiers={tiers}",
            "gateway.limits.max_concurrent_requests=4096",
            "gateway.public_grpc_port=0",
        ],
        log_path=work / "gateway.log",
        port=gateway_port,
    )
    triton.start()
    try:
        gateway.start()
        results = asyncio.run(
            measure(triton.grpc_url, f"http://127.0.0.1:{gateway_port}", str(gateway.metrics_url), key, args)
        )
    finally:
        gateway.stop()
        triton.stop()
    summary = {
        "settings": {
            "streams": args.streams,
            "max_tokens": args.max_tokens,
            "rounds": args.rounds,
            "pairs": args.pairs,
        },
        **results.summary(),
        "raw": asdict(results),
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "raw"}, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
