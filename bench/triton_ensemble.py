"""The engine behind the real tritonserver: the public `ensemble` model,
every request its own gRPC stream, all at once from one asyncio process.

Prompts travel as text (`tokenizer.decode(ids)`), so the server re-tokenizes
them; byte-level BPE may merge a few ids differently, so prompt lengths differ
slightly from the offline rows (the sum is reported). Output tokens are
counted from `num_output_tokens` (per streamed delta); the row also reports
how the streams were delivered: tokens per response and the gaps between a
stream's responses."""

from __future__ import annotations

import asyncio
import functools
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc.aio as grpcclient
from tokenizers import Tokenizer
from tritonclient.utils import np_to_triton_dtype

from serving.launcher import LaunchOptions, TritonServer, free_local_ports
from serving.settings import DeploymentSettings

from .engine_offline import EngineBenchSettings
from .progress import progress_bar
from .result import MethodResult
from .workload import BenchRequest, total_output_tokens

MODEL = "ensemble"


@dataclass
class TritonBenchSettings(EngineBenchSettings):
    """The offline engine's settings, served; plus what only a server has."""

    postprocessing_instances: int = 1
    request_timeout_s: float = 1800.0


@dataclass
class StreamTally:
    output_tokens: int = 0
    input_tokens: int = 0
    finish_reason: str | None = None
    token_responses: list[float] = field(default_factory=list)  # arrival (perf_counter) of each with tokens


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def delivery(tallies: list[StreamTally]) -> dict[str, float]:
    """How the tokens reached the streams: tokens per response, and the gaps
    between one stream's consecutive responses (all streams pooled), ms."""
    responses = sum(len(t.token_responses) for t in tallies)
    gaps = [b - a for t in tallies for a, b in zip(t.token_responses, t.token_responses[1:])]
    return {
        "responses": responses,
        "tokens_per_response": round(sum(t.output_tokens for t in tallies) / max(1, responses), 2),
        "gap_ms_p50": round(1000 * statistics.median(gaps), 1) if gaps else 0.0,
        "gap_ms_p99": round(1000 * _percentile(gaps, 0.99), 1),
    }


def _tensor(name: str, array: np.ndarray) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
    tensor.set_data_from_numpy(array)
    return tensor


def _inputs(text: str, max_tokens: int) -> list[grpcclient.InferInput]:
    return [
        _tensor("text_input", np.array([[text.encode()]], dtype=np.object_)),
        _tensor("max_tokens", np.array([[max_tokens]], dtype=np.int32)),
        _tensor("temperature", np.array([[0.0]], dtype=np.float32)),
        _tensor("ignore_eos", np.array([[True]], dtype=np.bool_)),
        _tensor("stream", np.array([[True]], dtype=np.bool_)),
        _tensor("return_num_output_tokens", np.array([[True]], dtype=np.bool_)),
        _tensor("return_num_input_tokens", np.array([[True]], dtype=np.bool_)),
    ]


async def _one_stream(
    client: grpcclient.InferenceServerClient,
    request_id: str,
    text: str,
    max_tokens: int,
    timeout_s: float,
    on_tokens: Any,
) -> StreamTally:
    done = asyncio.Event()

    async def requests() -> AsyncIterator[dict[str, Any]]:
        yield {"model_name": MODEL, "inputs": _inputs(text, max_tokens), "request_id": request_id}
        # keep the stream open until the last response: closing the request
        # side early is not what a streaming client does
        await done.wait()

    tally = StreamTally()
    finished = False
    responses = client.stream_infer(requests(), stream_timeout=timeout_s)
    try:
        async for result, error in responses:
            if error is not None:
                raise RuntimeError(f"request {request_id}: {error}")
            delta = result.as_numpy("num_output_tokens")
            if delta is not None:
                n = int(delta.sum())
                tally.output_tokens += n
                if n:
                    tally.token_responses.append(time.perf_counter())
                on_tokens(n)
            prompt = result.as_numpy("num_input_tokens")
            if prompt is not None and not tally.input_tokens:
                tally.input_tokens = int(prompt.sum())
            reason = result.as_numpy("finish_reason")
            if reason is not None and reason.size and reason.reshape(-1)[0]:
                tally.finish_reason = reason.reshape(-1)[0].decode()
            final = result.get_response().parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                finished = True
                break
    finally:
        done.set()  # the request side ends, so the call closes normally
        if not finished:
            responses.cancel()
    return tally


async def _run_all(
    grpc_url: str, texts: list[str], workload: list[BenchRequest], timeout_s: float
) -> tuple[float, list[StreamTally]]:
    async with grpcclient.InferenceServerClient(grpc_url) as client:
        # warm-up: one short request through every stage, untimed
        await _one_stream(client, "bench-warmup", texts[0][:64] or "hello", 4, timeout_s, lambda n: None)
        with progress_bar(total_output_tokens(workload), f"tritonserver ensemble, {len(workload)} gRPC streams") as bar:
            started = time.perf_counter()
            tallies = await asyncio.gather(
                *(
                    _one_stream(client, f"bench-{i}", text, request.max_tokens, timeout_s, bar.update)
                    for i, (text, request) in enumerate(zip(texts, workload))
                )
            )
            seconds = time.perf_counter() - started
    return seconds, list(tallies)


@functools.lru_cache(maxsize=4)
def _tokenizer(model_dir: str) -> Tokenizer:
    return Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))


def prompt_texts(model_dir: str, workload: list[BenchRequest]) -> list[str]:
    """The prompts as text (the ensemble tokenizes them again); the
    tokenizer is loaded once per model folder, not per round."""
    tokenizer = _tokenizer(model_dir)
    return [tokenizer.decode(list(r.prompt_ids), skip_special_tokens=False) for r in workload]


@contextmanager
def bench_server(settings: TritonBenchSettings, num_requests: int) -> Iterator[tuple[TritonServer, float]]:
    """The engine behind a real tritonserver with the bench's settings, and
    its start-up seconds."""
    deployment = DeploymentSettings.load(
        environ={},
        model_dir=settings.model_dir,
        dtype=settings.dtype,
        max_num_seqs=settings.max_num_seqs,
        max_num_batched_tokens=settings.max_num_batched_tokens,
        max_tokens_in_paged_kv_cache=settings.kv_tokens,
        num_threads=settings.num_threads,
        max_queue_size=max(256, 2 * num_requests),
        postprocessing_instances=settings.postprocessing_instances,
    )
    http, grpc, metrics = free_local_ports(3)
    with tempfile.TemporaryDirectory(prefix="bench-triton-") as work:
        options = LaunchOptions(
            settings=deployment,
            http_port=http,
            grpc_port=grpc,
            metrics_port=metrics,
            address="127.0.0.1",
            work_dir=Path(work),
            ready_timeout_s=600,
        )
        t0 = time.perf_counter()
        with TritonServer(options) as server:
            yield server, time.perf_counter() - t0


def served_result(
    settings: TritonBenchSettings,
    workload: list[BenchRequest],
    seconds: float,
    tallies: list[StreamTally],
    label: str,
    extra: dict[str, Any],
) -> MethodResult:
    produced = sum(t.output_tokens for t in tallies)
    expected = total_output_tokens(workload)
    reasons = sorted({t.finish_reason or "none" for t in tallies})
    streams = delivery(tallies)
    note = (
        f"prompt sent as text (re-tokenized); {streams['tokens_per_response']:.2f} tokens per response, "
        f"gaps p50 {streams['gap_ms_p50']:.0f} / p99 {streams['gap_ms_p99']:.0f} ms"
    )
    if produced != expected:
        note += f"; {produced} tokens counted, {expected} requested"
    return MethodResult(
        method=f"triton-{settings.dtype}",
        label=label,
        dtype=settings.dtype,
        useful_output_tokens=produced,
        seconds=seconds,
        num_requests=len(workload),
        note=note,
        extra={
            **extra,
            "finish_reasons": reasons,
            "prompt_tokens_server_side": sum(t.input_tokens for t in tallies),
            "postprocessing_instances": settings.postprocessing_instances,
            "delivery": streams,
        },
    )


def served_run(
    server: TritonServer, texts: list[str], workload: list[BenchRequest], timeout_s: float
) -> tuple[float, list[StreamTally]]:
    return asyncio.run(_run_all(server.grpc_url, texts, workload, timeout_s))


def run_triton_ensemble(settings: TritonBenchSettings, workload: list[BenchRequest]) -> MethodResult:
    texts = prompt_texts(settings.model_dir, workload)
    with bench_server(settings, len(workload)) as (server, startup_s):
        seconds, tallies = served_run(server, texts, workload, settings.request_timeout_s)
    return served_result(
        settings, workload, seconds, tallies, "engine via tritonserver ensemble (gRPC)", {"server_startup_s": startup_s}
    )
