"""One replica's capacity curve for `python -m serving plan`: closed-loop
load through the real tritonserver (`ensemble`, gRPC, the client library)
at rising concurrency; at each level, output tokens/s of all streams
together, TTFT p90 and the mean time per output token per stream.

Each request has a prompt of ~PROMPT_TOKENS distinct tokens (no prefix
shared, so the prefix cache does not flatter the numbers) and OUTPUT_TOKENS
forced output tokens (ignore_eos). Writes build/bench/capacity.json, which
`python -m serving plan --bench-json` reads.

    python -m bench.capacity [--levels 1,2,4,8,16] [--seconds 20]"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path

from client import AsyncLLMClient, ClientConfig, GenerationOptions, RetryConfig
from serving.default_model import ensure_default_model
from serving.launcher import LaunchOptions, TritonServer, free_local_ports
from serving.paths import BUILD_DIR
from serving.settings import DeploymentSettings

from .report import MachineInfo

OUTPUT_TOKENS = 64
PROMPT_WORDS = 90  # ~128 tokens with SmolLM2's tokenizer


def _prompt(worker: int, turn: int) -> str:
    words = " ".join(f"w{(worker * 7919 + turn * 104729 + i * 31) % 100003}" for i in range(PROMPT_WORDS))
    return f"Request {worker}-{turn}. Summarise these codes: {words}"


async def _level(client: AsyncLLMClient, concurrency: int, seconds: float) -> dict[str, float | None]:
    ttfts: list[float] = []
    tpots: list[float] = []
    tokens = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def worker(index: int) -> None:
        nonlocal tokens
        turn = 0
        while time.perf_counter() < deadline:
            result = await client.generate(
                _prompt(index, turn), GenerationOptions(max_tokens=OUTPUT_TOKENS, temperature=0.0, ignore_eos=True)
            )
            turn += 1
            tokens += result.num_output_tokens
            if result.ttft_s is not None:
                ttfts.append(result.ttft_s)
            if result.tpot_s is not None:
                tpots.append(result.tpot_s)

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - started
    return {
        "concurrency": concurrency,
        "output_tokens_per_s": tokens / elapsed,
        "ttft_p90_s": statistics.quantiles(ttfts, n=10)[-1] if len(ttfts) >= 2 else (ttfts[0] if ttfts else None),
        "tpot_s": statistics.fmean(tpots) if tpots else None,
        "requests": len(ttfts),
        "seconds": elapsed,
    }


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


async def _sweep(grpc_url: str, levels: list[int], seconds: float) -> list[dict[str, float | None]]:
    config = ClientConfig(url=grpc_url, transport="grpc", retry=RetryConfig(max_attempts=1))
    async with AsyncLLMClient(config) as client:
        await client.generate(_prompt(0, -1), max_tokens=4)  # warm-up
        rows: list[dict[str, float | None]] = []
        for level in levels:
            row = await _level(client, level, seconds)
            print(
                f"  concurrency {level:3d}: {row['output_tokens_per_s']:7.1f} output tokens/s, TTFT p90 "
                f"{_ms(row['ttft_p90_s'])}, TPOT {_ms(row['tpot_s'])} ({row['requests']} requests)",
                flush=True,
            )
            rows.append(row)
        return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", default="1,2,4,8,16", help="concurrency levels, comma-separated")
    parser.add_argument("--seconds", type=float, default=20.0, help="closed-loop time per level")
    parser.add_argument("--out", type=Path, default=BUILD_DIR / "bench" / "capacity.json")
    args = parser.parse_args(argv)
    levels = [int(v) for v in args.levels.split(",")]
    settings = DeploymentSettings.load(environ={}, model_dir=str(ensure_default_model()))
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
    machine = MachineInfo.collect(settings.engine.num_threads)
    print(f"capacity sweep: {machine.line()}", flush=True)
    server.start()
    try:
        rows = asyncio.run(_sweep(server.grpc_url, levels, args.seconds))
    finally:
        server.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "machine": machine.line(),
                "model": Path(settings.engine.model_dir).name,
                "workload": {
                    "prompt": f"~{PROMPT_WORDS} words (~128 tokens), distinct",
                    "output_tokens": OUTPUT_TOKENS,
                    "seconds_per_level": args.seconds,
                    "closed_loop": True,
                },
                "command": "python -m bench.capacity " + " ".join(argv or []),
                "measurements": rows,
            },
            indent=2,
        )
        + "\n"
    )
    print(
        f"wrote {args.out}; plan with: python -m serving plan --bench-json {args.out} --peak-qps Q "
        f"--mean-output-tokens N"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
