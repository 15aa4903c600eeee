"""Per-token cost of the text path (preprocessing + postprocessing + the
ensemble's transport) at N concurrent gRPC streams.

The same prompts run twice with a fixed output length (ignore_eos): once
through `ensemble`, once straight to `python_llm` with the token ids that
`preprocessing` built for them. The difference in time per output token is
what the text path costs. A warm-up pass fills the prefix cache first, so both
measured passes find the same cached prompts.

    python -m bench.text_path_overhead                  # starts its own server
    python -m bench.text_path_overhead --grpc-url 127.0.0.1:8001
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import np_to_triton_dtype

TOPICS = ["a robot", "the sea", "a small town", "a dragon", "the moon", "a library", "a storm", "a garden"]


@dataclass(frozen=True)
class BenchConfig:
    grpc_url: str
    concurrency: int = 64
    max_tokens: int = 32


@dataclass
class StreamTiming:
    sent_s: float
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens in that response)
    error: str | None = None

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.arrivals)

    @property
    def ttft_s(self) -> float:
        return self.arrivals[0][0] - self.sent_s

    @property
    def tpot_s(self) -> float:
        """(last token - first token) / (tokens - 1): what genai-perf calls ITL."""
        return (self.arrivals[-1][0] - self.arrivals[0][0]) / max(1, self.tokens - 1)


@dataclass
class PassResult:
    label: str
    wall_s: float
    streams: list[StreamTiming]

    def row(self) -> dict[str, float]:
        ok = [s for s in self.streams if s.error is None and s.arrivals]
        tpots = sorted(s.tpot_s * 1000 for s in ok)
        tokens = sum(s.tokens for s in ok)
        return {
            "ok": len(ok),
            "errors": len(self.streams) - len(ok),
            "tokens": tokens,
            "ttft_ms_p50": statistics.median(s.ttft_s * 1000 for s in ok),
            "tpot_ms_mean": statistics.fmean(tpots),
            "tpot_ms_p50": statistics.median(tpots),
            "tpot_ms_p90": tpots[int(0.9 * (len(tpots) - 1))],
            "tokens_per_s": tokens / self.wall_s,
            "wall_s": self.wall_s,
        }


def _tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def _messages(index: int) -> str:
    topic = TOPICS[index % len(TOPICS)]
    return json.dumps([{"role": "user", "content": f"Tell story number {index} about {topic}."}])


def ensemble_inputs(index: int, config: BenchConfig) -> list[grpcclient.InferInput]:
    return [
        _tensor("text_input", np.array([[b""]], dtype=np.object_)),
        _tensor("messages", np.array([[_messages(index).encode()]], dtype=np.object_)),
        _tensor("max_tokens", np.array([[config.max_tokens]], dtype=np.int32)),
        _tensor("stream", np.array([[True]])),
        _tensor("ignore_eos", np.array([[True]])),
        _tensor("temperature", np.array([[0.0]], dtype=np.float32)),
        _tensor("return_num_output_tokens", np.array([[True]])),
    ]


def llm_inputs(input_ids: np.ndarray, config: BenchConfig) -> list[grpcclient.InferInput]:
    ids = input_ids.reshape(1, -1).astype(np.int32)
    return [
        _tensor("input_ids", ids),
        _tensor("input_lengths", np.array([[ids.shape[1]]], dtype=np.int32)),
        _tensor("request_output_len", np.array([[config.max_tokens]], dtype=np.int32)),
        _tensor("streaming", np.array([[True]])),
        _tensor("ignore_eos", np.array([[True]])),
        _tensor("temperature", np.array([[0.0]], dtype=np.float32)),
    ]


def preprocessed_ids(config: BenchConfig) -> list[np.ndarray]:
    """The prompt ids `preprocessing` builds for each request of the pass."""
    client = grpcclient.InferenceServerClient(config.grpc_url)
    try:
        out = []
        for index in range(config.concurrency):
            inputs = [t for t in ensemble_inputs(index, config) if t.name() in ("text_input", "messages", "max_tokens")]
            result = client.infer("preprocessing", inputs, outputs=[grpcclient.InferRequestedOutput("input_ids")])
            out.append(result.as_numpy("input_ids"))
        return out
    finally:
        client.close()


async def _one_stream(
    client: grpcaio.InferenceServerClient, model: str, inputs: list[grpcclient.InferInput], token_output: str
) -> StreamTiming:
    done = asyncio.Event()

    async def requests():
        yield {"model_name": model, "inputs": inputs, "enable_empty_final_response": True}
        await done.wait()  # keep the stream open until the final response

    timing = StreamTiming(sent_s=time.perf_counter())
    try:
        async for result, error in client.stream_infer(requests()):
            now = time.perf_counter()
            if error is not None:
                timing.error = str(error)
                break
            tokens = result.as_numpy(token_output)
            count = (
                0
                if tokens is None
                else (int(tokens.reshape(-1)[0]) if token_output == "num_output_tokens" else int(tokens.shape[-1]))
            )
            if count:
                timing.arrivals.append((now, count))
            if result.get_response().parameters["triton_final_response"].bool_param:
                break
    finally:
        done.set()
    return timing


async def run_pass(
    config: BenchConfig, label: str, model: str, inputs: list[list[grpcclient.InferInput]], token_output: str
) -> PassResult:
    client = grpcaio.InferenceServerClient(config.grpc_url)
    try:
        start = time.perf_counter()
        streams = await asyncio.gather(*(_one_stream(client, model, i, token_output) for i in inputs))
        return PassResult(label, time.perf_counter() - start, list(streams))
    finally:
        await client.close()


def measure(config: BenchConfig) -> list[PassResult]:
    ids = preprocessed_ids(config)
    ensemble = [ensemble_inputs(i, config) for i in range(config.concurrency)]
    direct = [llm_inputs(i, config) for i in ids]
    asyncio.run(run_pass(config, "warm-up", "ensemble", ensemble, "num_output_tokens"))
    return [
        asyncio.run(run_pass(config, "ensemble (pre + post + transport)", "ensemble", ensemble, "num_output_tokens")),
        asyncio.run(run_pass(config, "python_llm direct (same ids)", "python_llm", direct, "output_ids")),
    ]


def print_table(config: BenchConfig, results: list[PassResult]) -> None:
    rows = [(r.label, r.row()) for r in results]
    print(
        f"# text path overhead, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()} "
        f"({platform.processor() or platform.machine()}), {config.concurrency} concurrent gRPC streams, "
        f"max_tokens {config.max_tokens} (ignore_eos)"
    )
    columns = [
        "ok",
        "errors",
        "tokens",
        "ttft_ms_p50",
        "tpot_ms_mean",
        "tpot_ms_p50",
        "tpot_ms_p90",
        "tokens_per_s",
        "wall_s",
    ]
    print("| path | " + " | ".join(columns) + " |")
    print("|---|" + "---|" * len(columns))
    for label, row in rows:
        print(
            f"| {label} | "
            + " | ".join(f"{row[c]:.1f}" if isinstance(row[c], float) else str(row[c]) for c in columns)
            + " |"
        )
    (_, full), (_, bare) = rows
    extra = full["tpot_ms_mean"] - bare["tpot_ms_mean"]
    print(
        f"\ntext path cost per output token: {extra:+.1f} ms mean TPOT "
        f"({100 * extra / bare['tpot_ms_mean']:+.0f}% over python_llm alone); "
        f"throughput {full['tokens_per_s']:.0f} vs {bare['tokens_per_s']:.0f} tokens/s"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grpc-url", help="a running server; default: start one on free ports")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--postprocessing-instances", type=int, default=4)
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.max_tokens < 2:
        parser.error("need --concurrency >= 1 and --max-tokens >= 2")

    if args.grpc_url:
        config = BenchConfig(args.grpc_url, args.concurrency, args.max_tokens)
        print_table(config, measure(config))
        return

    from serving.default_model import ensure_default_model
    from serving.launcher import LaunchOptions, TritonServer, free_local_ports
    from serving.settings import DeploymentSettings

    settings = DeploymentSettings.load(
        environ={},
        model_dir=str(ensure_default_model()),
        postprocessing_instances=args.postprocessing_instances,
        max_queue_size=max(256, 2 * args.concurrency),
    )
    http, grpc, metrics = free_local_ports(3)
    with tempfile.TemporaryDirectory(prefix="text-path-bench-") as work:
        with TritonServer(
            LaunchOptions(
                settings=settings,
                http_port=http,
                grpc_port=grpc,
                metrics_port=metrics,
                address="127.0.0.1",
                work_dir=Path(work),
            )
        ) as server:
            config = BenchConfig(server.grpc_url, args.concurrency, args.max_tokens)
            print_table(config, measure(config))


if __name__ == "__main__":
    main()
