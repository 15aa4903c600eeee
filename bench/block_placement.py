"""Where a sequence's KV blocks lie, and what it costs the decode attention.

    python -m bench.block_placement [--seqs 64] [--context 200] [--finished 600] [--rounds 2]

1. Patterns: decode steps of `--seqs` sequences at ~`--context` tokens whose
   block tables are one run each, interleaved (block j of sequence s at
   j x seqs + s: what decodes growing side by side take from a fresh free
   list), descending runs, or shuffled; the attention's and the step's
   median time (bench.step_profile's clock), rounds interleaved.
2. Churn: the engine's real scheduler and block pool under a stand-in runner
   (no model): 64 sequences, prompts of 32-256 and outputs of 16-512 tokens,
   a new request for each one that ends, until `--finished` have ended; with
   prefix caching on and off. Reports how many neighbouring table entries
   of the decoding requests are adjacent blocks, then times decode steps
   with exactly those tables and contexts, and with the same contexts in
   one run each (the control).
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable
from types import SimpleNamespace

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler_output import CachedRequestData, NewRequestData, RunnerOutput, SchedulerOutput
from python_llm.engine.engine import LLMEngine
from python_llm.engine.worker.runner import ModelRunner

from .step_profile import CallClock, instrument, profile

ATTENTION = "paged_decode_attention"
BLOCK_SIZE = EngineConfig.block_size  # the engine's default, which every run here uses


def decode_steps(tables: list[list[int]], contexts: list[int]) -> Callable[[int], SchedulerOutput]:
    """Step 0 hands the runner the sequences at `contexts` - 12 tokens with
    `tables`; later steps advance them one token each (within their blocks)."""
    ids = [f"s{i}" for i in range(len(tables))]

    def step(index: int) -> SchedulerOutput:
        positions = [c - 12 + index for c in contexts]
        if index:
            return SchedulerOutput([], CachedRequestData(ids, [None] * len(ids), positions), [1] * len(ids), len(ids))
        new = [
            NewRequestData(rid, tuple(range(100, 101 + p)), p + 1, SamplingParams(temperature=0.0), tuple(t), p)
            for rid, p, t in zip(ids, positions, tables)
        ]
        return SchedulerOutput(new, CachedRequestData(), [1] * len(ids), len(ids))

    return step


def pattern_tables(pattern: str, seqs: int, per_seq: int, num_blocks: int, seed: int) -> list[list[int]]:
    if pattern == "runs":
        return [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(seqs)]
    if pattern == "interleaved":
        return [[j * seqs + s for j in range(per_seq)] for s in range(seqs)]
    if pattern == "descending":
        return [list(range((s + 1) * per_seq - 1, s * per_seq - 1, -1)) for s in range(seqs)]
    order = list(range(num_blocks))
    random.Random(seed).shuffle(order)
    return [order[s * per_seq : (s + 1) * per_seq] for s in range(seqs)]


def time_tables(
    model_dir: str, threads: int, num_blocks: int, tables: list[list[int]], contexts: list[int], repeats: int
) -> tuple[float, float]:
    """(step, attention) medians in ms of decode steps with these tables."""
    config = EngineConfig(
        model_dir=model_dir, dtype="float32", num_threads=threads, max_tokens_in_paged_kv_cache=num_blocks * BLOCK_SIZE
    )
    runner = ModelRunner(config)
    clock = CallClock()
    instrument(runner, clock)
    total, parts = profile(runner, clock, decode_steps(tables, contexts), repeats)
    return total * 1e3, parts.get(ATTENTION, 0.0) * 1e3


class EchoRunner:
    """Runs no model: each request that samples gets token 10. Enough for the
    scheduler and the block pool to admit, grow and free as they serve."""

    runs_layer_slices = False

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks, self.block_size = num_blocks, block_size
        self.model_info = SimpleNamespace(max_model_len=4096, vocab_size=1000, eos_token_ids=[2], num_layers=0)
        self._known: dict[str, int] = {}  # request id -> tokens it has (prompt + sampled)

    def execute(self, scheduled: SchedulerOutput) -> RunnerOutput:
        for rid in (*scheduled.preempted_req_ids, *scheduled.finished_req_ids):
            self._known.pop(rid, None)
        for new in scheduled.scheduled_new_reqs:
            self._known[new.request_id] = len(new.token_ids)
        tokens = []
        for rid, start, n in scheduled.chunks():
            if start + n == self._known[rid]:
                self._known[rid] += 1
                tokens.append(10)
        return RunnerOutput(token_ids=tokens)


def churned_tables(
    finished: int, caching: bool, seed: int, kv_tokens: int = 32768
) -> tuple[list[list[int]], list[int], int]:
    config = EngineConfig(
        model_dir="(none)",
        max_num_seqs=64,
        max_num_batched_tokens=512,
        max_tokens_in_paged_kv_cache=kv_tokens,
        enable_kv_cache_reuse=caching,
    )
    engine = LLMEngine(config, EchoRunner(config.num_cpu_blocks, config.block_size))
    rng = random.Random(seed)
    count = 0

    def submit() -> None:
        nonlocal count
        prompt = [rng.randrange(10, 900) for _ in range(rng.randint(32, 256))]
        params = SamplingParams(max_tokens=rng.randint(16, 512), temperature=0.0, ignore_eos=True)
        engine.add_request(f"r{count}", prompt, params)
        count += 1

    for _ in range(80):
        submit()
    ended = 0
    while ended < finished:
        for output in engine.step():
            if output.finished:
                ended += 1
                submit()
    scheduler = engine.scheduler
    decoding = [r for r in scheduler.running if r.num_computed_tokens >= r.num_prompt_tokens + 12]
    tables = [scheduler.kv.block_ids(r.request_id) for r in decoding]
    return tables, [r.num_computed_tokens for r in decoding], config.num_cpu_blocks


def adjacent_share(tables: list[list[int]]) -> float:
    pairs = sum(len(t) - 1 for t in tables)
    return sum(1 for t in tables for a, b in zip(t, t[1:]) if b == a + 1) / max(pairs, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--finished", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.model_dir is None:
        from serving.default_model import ensure_default_model

        args.model_dir = str(ensure_default_model())

    per_seq = -(-(args.context + 16) // BLOCK_SIZE)
    num_blocks = 4 * args.seqs * per_seq
    contexts = [args.context - 8 + i % 16 for i in range(args.seqs)]
    patterns = ("runs", "interleaved", "descending", "shuffled")
    timed: dict[str, list[tuple[float, float]]] = {p: [] for p in patterns}
    for _ in range(args.rounds):
        for pattern in patterns:
            tables = pattern_tables(pattern, args.seqs, per_seq, num_blocks, args.seed)
            timed[pattern].append(time_tables(args.model_dir, args.threads, num_blocks, tables, contexts, args.repeats))
    print(f"{args.seqs} sequences x ~{args.context} tokens, decode step / attention, ms (per round):")
    for pattern, rows in timed.items():
        print(f"  {pattern:12s} " + "  ".join(f"{step:6.1f} / {attention:5.1f}" for step, attention in rows))

    for caching in (True, False):
        tables, ctx, blocks = churned_tables(args.finished, caching, args.seed)
        control = []
        start = 0
        for table in tables:
            control.append(list(range(start, start + len(table))))
            start += len(table)
        print(
            f"churned pool, prefix caching {'on' if caching else 'off'}: {len(tables)} decoding at "
            f"{statistics.mean(ctx):.0f} tokens on average, {adjacent_share(tables):.0%} of neighbouring "
            f"table entries adjacent"
        )
        for _ in range(args.rounds):
            churned = time_tables(args.model_dir, args.threads, blocks, tables, ctx, args.repeats)
            runs = time_tables(args.model_dir, args.threads, blocks, control, ctx, args.repeats)
            print(
                f"  step / attention: these tables {churned[0]:6.1f} / {churned[1]:5.1f} ms, "
                f"one run each {runs[0]:6.1f} / {runs[1]:5.1f} ms"
            )


if __name__ == "__main__":
    main()
