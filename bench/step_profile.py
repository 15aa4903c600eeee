"""Where a runner step's time goes on this machine, call by call.

    python -m bench.step_profile [--seqs 64] [--context 200] [--prefill-tokens 512] [--repeats 5]

The steps are bench.runner_probe's (a decode of `--seqs` sequences at
~`--context` positions; a prefill of `--prefill-tokens` in two chunks), on
the fp32 model as the engine builds it (packed projections, native
kernels). Each projection and each native kernel call is timed by wrapping
it (the CPU ops are synchronous, so a call's wall time is its cost); "the
rest" is the step minus them: embedding, slicing, Python. Medians over
`--repeats` steps after one warm-up step.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from python_llm.engine.config import EngineConfig
from python_llm.engine.worker.models.packed_linear import LayerProjections
from python_llm.engine.worker.runner import ModelRunner

from .runner_probe import decode_step, prefill_step

KERNEL_CALLS = (
    "rms_norm",
    "rotary_cache_write",
    "silu_mul",
    "paged_decode_attention",
    "paged_prefill_attention",
    "lm_head_argmax",
    "argmax_rows",
)


class CallClock:
    """Seconds spent in each wrapped call during one step."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def timed(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return call(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started

        return wrapper


class TimedLinear:
    """A projection whose calls are counted under its name."""

    def __init__(self, inner: Any, name: str, clock: CallClock) -> None:
        self._call = clock.timed(name, inner.__call__)
        self._plus = clock.timed(name, inner.plus)

    def __call__(self, x: Any) -> Any:
        return self._call(x)

    def plus(self, x: Any, other: Any) -> Any:
        return self._plus(x, other)


def instrument(runner: ModelRunner, clock: CallClock) -> None:
    model = runner.model
    for layer in model.layers:
        p = layer.projections
        timed: dict[str, Any] = {
            name: TimedLinear(getattr(p, name), f"projection {name}", clock) for name in ("qkv", "o", "gate_up", "down")
        }
        # timing wrappers stand in for the projections (duck-typed: they forward the calls)
        layer.projections = LayerProjections(**timed)  # type: ignore[assignment]  # nn.Module attrs: Tensor | Module
    if model.lm_head_gemm is not None:
        # type-ignored below: a timing wrapper stands in for the GEMM (duck-typed)
        model.lm_head_gemm = TimedLinear(model.lm_head_gemm, "LM head GEMM", clock)  # type: ignore[assignment]
    if model.greedy_head is not None:  # bf16 or int16, with its verified argmax
        model.greedy_head = clock.timed(
            # type-ignored below: a timing wrapper stands in for the greedy head (duck-typed)
            f"LM head {type(model.greedy_head).__name__}",  # type: ignore[assignment]
            model.greedy_head,
        )
    kernels = model.kernels
    if kernels is not None:  # one object, shared by the model, its layers and the attention metadata
        for name in KERNEL_CALLS:
            setattr(kernels, name, clock.timed(name, getattr(kernels, name)))


def profile(
    runner: ModelRunner, clock: CallClock, make: Callable[[int], Any], repeats: int
) -> tuple[float, dict[str, float]]:
    totals: list[float] = []
    parts: dict[str, list[float]] = defaultdict(list)
    for r in range(repeats + 1):
        out = make(r)
        clock.seconds.clear()
        started = time.perf_counter()
        runner.execute(out)
        elapsed = time.perf_counter() - started
        if r:  # the first step warms allocators and kernels
            totals.append(elapsed)
            for name, seconds in clock.seconds.items():
                parts[name].append(seconds)
    return statistics.median(totals), {name: statistics.median(values) for name, values in parts.items()}


def report(title: str, total: float, parts: dict[str, float]) -> None:
    print(f"{title}: step {total * 1e3:.1f} ms (median)")
    for name, seconds in sorted(parts.items(), key=lambda item: -item[1]):
        print(f"  {name:28s} {seconds * 1e3:8.1f} ms  {seconds / total:6.1%}")
    rest = total - sum(parts.values())
    print(f"  {'the rest':28s} {rest * 1e3:8.1f} ms  {rest / total:6.1%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", default=None)
    parser.add_argument("--seqs", type=int, default=64)
    parser.add_argument("--context", type=int, default=200)
    parser.add_argument("--prefill-tokens", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--linear-backend", default="auto", choices=("auto", "fma", "onednn", "torch"))
    args = parser.parse_args()
    if args.model_dir is None:
        from serving.default_model import ensure_default_model

        args.model_dir = str(ensure_default_model())
    config = EngineConfig(
        model_dir=args.model_dir,
        dtype="float32",
        num_threads=args.threads,
        linear_backend=args.linear_backend,
        max_tokens_in_paged_kv_cache=args.seqs * (args.context + 80) + 1024,
    )
    runner = ModelRunner(config)
    clock = CallClock()
    instrument(runner, clock)
    report(
        f"decode {args.seqs} seqs x ~{args.context} ctx",
        *profile(runner, clock, lambda r: decode_step(runner, args.seqs, args.context, r), args.repeats),
    )
    report(
        f"prefill {args.prefill_tokens} tokens",
        *profile(runner, clock, lambda r: prefill_step(runner, args.prefill_tokens, r), max(2, args.repeats // 2)),
    )


if __name__ == "__main__":
    main()
