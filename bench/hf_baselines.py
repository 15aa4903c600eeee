"""Hugging Face transformers baselines on the same workload, at their best
settings: SDPA attention, the engine's dtype and thread count,
`torch.inference_mode()`, greedy, EOS never ending a request early."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForCausalLM, GenerationConfig

from python_llm.engine.worker.runner import DTYPES

from .progress import progress_bar
from .result import MethodResult
from .workload import BenchRequest, total_output_tokens

# a Transformers causal LM; Any, because its generation API (generate, the
# continuous-batching manager, generation_config) is not typed for mypy
HFCausalLM = Any

log = logging.getLogger(__name__)
NO_EOS = -1  # what transformers' continuous batching reads as "no EOS"


@dataclass
class HFBenchSettings:
    model_dir: str
    dtype: str = "float32"
    device: str = "cpu"
    # transformers' continuous batching: the engine's limits, so both schedule alike
    cb_max_batch_tokens: int = 512
    cb_max_requests_per_batch: int = 64
    cb_page_size: int = 256
    cb_num_blocks: int = 128  # 128 pages x 256 tokens: the whole workload fits at once


def load_model(settings: HFBenchSettings) -> HFCausalLM:
    model: HFCausalLM = AutoModelForCausalLM.from_pretrained(
        settings.model_dir, dtype=DTYPES[settings.dtype], attn_implementation="sdpa"
    )
    return model.to(settings.device).eval()


def _pad_id(model: HFCausalLM) -> int:
    config = model.generation_config
    pad = config.pad_token_id if config.pad_token_id is not None else config.eos_token_id
    if isinstance(pad, list):
        pad = pad[0]
    return int(pad) if pad is not None else 0


def _generate(model: HFCausalLM, prompts: list[tuple[int, ...]], new_tokens: int, pad_id: int) -> torch.Tensor:
    """Left-padded static batch; min = max new tokens, so EOS cannot end it early."""
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        input_ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        attention_mask[row, width - len(prompt) :] = 1
    input_ids, attention_mask = input_ids.to(model.device), attention_mask.to(model.device)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        pad_token_id=pad_id,
        eos_token_id=model.generation_config.eos_token_id,
    )
    with torch.inference_mode():
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config)
    if out.is_cuda:  # the clock stops when the tokens exist, not when their kernels were queued
        torch.cuda.synchronize(out.device)
    generated = out.shape[1] - width
    if generated != new_tokens:
        raise RuntimeError(f"HF generate produced {generated} tokens, {new_tokens} were asked")
    return out


def warm_up(model: HFCausalLM, workload: list[BenchRequest]) -> None:
    _generate(model, [workload[0].prompt_ids[:16]], 4, _pad_id(model))


def run_single(model: HFCausalLM, settings: HFBenchSettings, workload: list[BenchRequest], limit: int) -> MethodResult:
    """One request at a time (batch 1, no padding); only the first `limit`."""
    chosen = workload[:limit]
    pad = _pad_id(model)
    outputs = []
    with progress_bar(total_output_tokens(chosen), "HF generate, one at a time") as bar:
        started = time.perf_counter()
        for request in chosen:
            out = _generate(model, [request.prompt_ids], request.max_tokens, pad)
            outputs.append(out[0, len(request.prompt_ids) :])  # copied out after the clock stops
            bar.update(request.max_tokens)
        seconds = time.perf_counter() - started
    note = f"first {len(chosen)} of {len(workload)} requests" if len(chosen) < len(workload) else ""
    return MethodResult(
        method="hf-single",
        label="HF generate, one at a time",
        dtype=settings.dtype,
        useful_output_tokens=total_output_tokens(chosen),
        seconds=seconds,
        num_requests=len(chosen),
        note=note,
        outputs=[o.tolist() for o in outputs],
    )


def run_static_batches(
    model: HFCausalLM, settings: HFBenchSettings, workload: list[BenchRequest], batch_size: int
) -> MethodResult:
    """Batches of `batch_size` in arrival order; each batch generates its
    largest requested length, only the requested tokens count as output."""
    pad = _pad_id(model)
    generated = 0
    with progress_bar(total_output_tokens(workload), f"HF generate, static batch {batch_size}") as bar:
        started = time.perf_counter()
        for first in range(0, len(workload), batch_size):
            batch = workload[first : first + batch_size]
            longest = max(r.max_tokens for r in batch)
            _generate(model, [r.prompt_ids for r in batch], longest, pad)
            generated += longest * len(batch)
            bar.update(total_output_tokens(batch))
        seconds = time.perf_counter() - started
    useful = total_output_tokens(workload)
    return MethodResult(
        method=f"hf-batch-{batch_size}",
        label=f"HF generate, static batch {batch_size}",
        dtype=settings.dtype,
        useful_output_tokens=useful,
        seconds=seconds,
        num_requests=len(workload),
        note=f"{useful / generated:.0%} of generated tokens useful",
        extra={"generated_tokens": generated, "batch_size": batch_size},
    )


def run_continuous_batching(model: HFCausalLM, settings: HFBenchSettings, workload: list[BenchRequest]) -> MethodResult:
    """transformers' own continuous batching. `generate_batch` takes one
    max_new_tokens for all requests, so this uses the manager it wraps
    (`continuous_batching_context_manager`) and gives each request its own
    max_new_tokens through `add_request` -- the same scheduler and paged cache."""
    # imported here: older transformers (a GPU machine's) lack it, and the other rows need it not
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    longest = max(r.max_tokens for r in workload)
    generation = GenerationConfig(
        do_sample=False, max_new_tokens=longest, eos_token_id=NO_EOS, pad_token_id=_pad_id(model)
    )
    cb = ContinuousBatchingConfig(
        max_batch_tokens=settings.cb_max_batch_tokens,
        max_requests_per_batch=settings.cb_max_requests_per_batch,
        page_size=settings.cb_page_size,
        num_blocks=settings.cb_num_blocks,
        allow_block_sharing=False,
    )
    results: dict[str, Any] = {}  # request id -> its finished GenerationOutput
    with model.continuous_batching_context_manager(
        generation_config=generation, continuous_batching_config=cb, block=True, timeout=30
    ) as manager:
        with progress_bar(len(workload), "HF continuous batching", unit="req") as bar:
            started = time.perf_counter()
            for i, request in enumerate(workload):
                manager.add_request(
                    list(request.prompt_ids),
                    request_id=f"bench-{i}",
                    max_new_tokens=request.max_tokens,
                    eos_token_id=NO_EOS,
                )
            while len(results) < len(workload):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    results[result.request_id] = result
                    bar.update(1)
                elif result is None and not manager.is_running():
                    raise RuntimeError("transformers continuous batching stopped before finishing")
            seconds = time.perf_counter() - started
    failed = [rid for rid, r in results.items() if r.error is not None]
    if failed:
        raise RuntimeError(f"transformers continuous batching: {len(failed)} requests failed")
    produced = sum(len(r.generated_tokens) for r in results.values())
    expected = total_output_tokens(workload)
    if produced != expected:
        raise RuntimeError(f"transformers continuous batching produced {produced} tokens, {expected} were asked")
    return MethodResult(
        method="hf-cb",
        label="HF continuous batching (generate_batch's manager)",
        dtype=settings.dtype,
        useful_output_tokens=produced,
        seconds=seconds,
        num_requests=len(workload),
        note="per-request max_new_tokens via add_request",
        extra={"max_batch_tokens": settings.cb_max_batch_tokens, "page_size": settings.cb_page_size},
    )
