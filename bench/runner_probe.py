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
from python_llm.engine.worker.runner import ModelRunner
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler_output import ScheduledSequence, SchedulerOutput


def decode_step(runner: ModelRunner, seqs: int, context: int, step: int) -> SchedulerOutput:
    bs = runner.block_size
    per_seq = -(-(context + 64) // bs)
    greedy = SamplingParams()
    scheduled = []
    for i in range(seqs):
        position = context - 8 + (i % 16) + step   # ragged contexts, as in a real batch
        table = list(range(i * per_seq, (i + 1) * per_seq))
        scheduled.append(ScheduledSequence(f"r{i}", [100 + i], position, table, True, greedy))
    return SchedulerOutput(scheduled, seqs)


def prefill_step(runner: ModelRunner, tokens: int) -> SchedulerOutput:
    half = tokens // 2
    bs = runner.block_size
    blocks = -(-half // bs)
    seqs = [ScheduledSequence(f"p{i}", list(range(1000, 1000 + half)), 0,
                              list(range(i * blocks, (i + 1) * blocks)), True, SamplingParams())
            for i in range(2)]
    return SchedulerOutput(seqs, 2 * half)


def measure(runner: ModelRunner, make, repeats: int) -> tuple[float, float]:
    totals, models = [], []
    for r in range(repeats + 1):
        out = make(r)
        started = time.perf_counter()
        result = runner.execute(out)
        elapsed = time.perf_counter() - started
        if r:   # the first step warms allocators and kernels
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
    parser.add_argument("--attention-backend", nargs="+", default=["auto"], choices=("auto", "torch"),
                        help="auto: the native CPU kernels; torch: the PyTorch paths")
    args = parser.parse_args()
    if args.model_dir is None:
        from serving.default_model import ensure_default_model
        args.model_dir = str(ensure_default_model())

    for dtype, backend in [(d, b) for d in args.dtype for b in args.attention_backend]:
        config = EngineConfig(model_dir=args.model_dir, dtype=dtype, num_threads=args.threads,
                              max_tokens_in_paged_kv_cache=args.seqs * (args.context + 80) + 1024,
                              attention_backend=backend)
        runner = ModelRunner(config)
        print(f"{dtype} attention_backend={backend} "
              f"(decode attention: {'native' if runner.kernels else 'torch'})")
        total, model = measure(runner, lambda r: decode_step(runner, args.seqs, args.context, r), args.repeats)
        print(f"{dtype:9s} decode {args.seqs} seqs x ~{args.context} ctx: step {total * 1e3:7.1f} ms "
              f"(layers+LM head {model * 1e3:7.1f} ms, rest {(total - model) * 1e3:5.1f} ms) "
              f"-> {args.seqs / total:6.1f} tok/s")
        total, model = measure(runner, lambda r: prefill_step(runner, args.prefill_tokens), max(2, args.repeats // 2))
        print(f"{dtype:9s} prefill {args.prefill_tokens} tokens: step {total * 1e3:7.1f} ms "
              f"(layers+LM head {model * 1e3:7.1f} ms, rest {(total - model) * 1e3:5.1f} ms) "
              f"-> {args.prefill_tokens / total:6.1f} tok/s")


if __name__ == "__main__":
    main()
