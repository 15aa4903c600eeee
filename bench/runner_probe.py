"""Probe the model runner's step time on this machine.

    python -m bench.runner_probe [--dtype float32 bfloat16] [--seqs 64] [--context 200]

Decode: `--seqs` sequences, one token each, at ~`--context` positions (the KV
contents do not matter for timing). Prefill: one step of `--prefill-tokens`
split over 2 chunks. Reports total step time, the part inside decoder layers +
final norm + LM head (`model_seconds`), and the rest (input preparation,
sampling, Python).
"""

from __future__ import annotations

import argparse
import statistics
import time

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler_output import CachedRequestData, NewRequestData, SchedulerOutput
from python_llm.engine.worker.runner import ModelRunner


def decode_step(runner: ModelRunner, seqs: int, context: int, step: int) -> SchedulerOutput:
    """Step 0 hands the runner `seqs` requests whose next token is a decode;
    later steps only their progress, as the scheduler does."""
    positions = [context - 8 + (i % 16) + step for i in range(seqs)]  # ragged contexts, as in a real batch
    ids = [f"r{i}" for i in range(seqs)]
    if step:
        return SchedulerOutput([], CachedRequestData(ids, [None] * seqs, positions), [1] * seqs, seqs)
    per_seq = -(-(context + 64) // runner.block_size)
    new = [
        NewRequestData(
            rid,
            tuple(range(100, 101 + position)),
            position + 1,
            SamplingParams(temperature=0.0),
            tuple(range(i * per_seq, (i + 1) * per_seq)),
            position,
        )
        for i, (rid, position) in enumerate(zip(ids, positions))
    ]
    return SchedulerOutput(new, CachedRequestData(), [1] * seqs, seqs)


def prefill_step(runner: ModelRunner, tokens: int, step: int) -> SchedulerOutput:
    half = tokens // 2
    blocks = -(-half // runner.block_size)
    new = [
        NewRequestData(
            f"p{step}-{i}",
            tuple(range(1000, 1000 + half)),
            half,
            SamplingParams(temperature=0.0),
            tuple(range(i * blocks, (i + 1) * blocks)),
            0,
        )
        for i in range(2)
    ]
    return SchedulerOutput(
        new, CachedRequestData(), [half, half], 2 * half, finished_req_ids=[f"p{step - 1}-{i}" for i in range(2)]
    )


def measure(runner: ModelRunner, make, repeats: int) -> tuple[float, float]:
    totals, models = [], []
    for r in range(repeats + 1):
        out = make(r)
        started = time.perf_counter()
        result = runner.execute(out)
        elapsed = time.perf_counter() - started
        if r:  # the first step warms allocators and kernels
            totals.append(elapsed)
            models.append(result.model_seconds)
    return statistics.median(totals), statistics.median(models)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--dtype", nargs="+", default=["float32", "bfloat16"])
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--attention-backend",
        nargs="+",
        default=["auto"],
        choices=("auto", "torch"),
        help="auto: the native CPU kernels; torch: the PyTorch paths",
    )
    args = parser.parse_args()
    if args.model_dir is None:
        from serving.default_model import ensure_default_model

        args.model_dir = str(ensure_default_model())

    for dtype, backend in [(d, b) for d in args.dtype for b in args.attention_backend]:
        config = EngineConfig(
            model_dir=args.model_dir,
            dtype=dtype,
            num_threads=args.threads,
            max_tokens_in_paged_kv_cache=args.seqs * (args.context + 80) + 1024,
            attention_backend=backend,
        )
        runner = ModelRunner(config)
        print(f"{dtype} attention_backend={backend} (decode attention: {'native' if runner.kernels else 'torch'})")
        total, model = measure(runner, lambda r: decode_step(runner, args.seqs, args.context, r), args.repeats)  # noqa: B023
        print(
            f"{dtype:9s} decode {args.seqs} seqs x ~{args.context} ctx: step {total * 1e3:7.1f} ms "
            f"(layers+LM head {model * 1e3:7.1f} ms, rest {(total - model) * 1e3:5.1f} ms) "
            f"-> {args.seqs / total:6.1f} tok/s"
        )
        total, model = measure(
            runner,
            lambda r: prefill_step(runner, args.prefill_tokens, r),  # noqa: B023
            max(2, args.repeats // 2),
        )
        print(
            f"{dtype:9s} prefill {args.prefill_tokens} tokens: step {total * 1e3:7.1f} ms "
            f"(layers+LM head {model * 1e3:7.1f} ms, rest {(total - model) * 1e3:5.1f} ms) "
            f"-> {args.prefill_tokens / total:6.1f} tok/s"
        )


if __name__ == "__main__":
    main()
