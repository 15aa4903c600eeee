"""The engine's per-step overhead at full batch, in several fresh processes
(issue 18: "median over several fresh processes"): each process builds the
engine, prefills 64 of the workload's prompts and times pure-decode steps
(`engine_offline.measure_step_overhead`: wall time of `step()` minus the time
inside the model); the report gives every process's median and their median.

    python -m bench.step_overhead [--processes 5] [--steps 24] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

import torch


def one_process(args: argparse.Namespace) -> dict:
    from python_llm.engine.engine import LLMEngine
    from serving.default_model import ensure_default_model

    from .engine_offline import EngineBenchSettings, _sampling, engine_config, measure_step_overhead
    from .workload import Vocabulary, WorkloadSpec, make_workload

    torch.set_num_threads(args.threads)
    model_dir = str(ensure_default_model())
    workload = make_workload(WorkloadSpec(num_requests=64, seed=20240603), Vocabulary.from_model_dir(model_dir))
    engine = LLMEngine(engine_config(EngineBenchSettings(model_dir=model_dir, num_threads=args.threads)))
    engine.generate_results([(list(workload[0].prompt_ids[:16]), _sampling(4))])
    return measure_step_overhead(engine, workload, args.batch, args.steps).summary()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.step_overhead", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--processes", type=int, default=5)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(one_process(args)))
        return 0
    runs = []
    for i in range(args.processes):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "bench.step_overhead",
                "--child",
                "--steps",
                str(args.steps),
                "--batch",
                str(args.batch),
                "--threads",
                str(args.threads),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        runs.append(summary)
        print(
            f"process {i + 1}: overhead median {summary['overhead_ms_median']:.2f} ms, mean "
            f"{summary['overhead_ms_mean']:.2f} ms (step {summary['step_ms_mean']:.1f} ms, model "
            f"{summary['model_ms_mean']:.1f} ms, {summary['steps']} steps at {summary['batch']} sequences)",
            flush=True,
        )
    medians = [r["overhead_ms_median"] for r in runs]
    print(
        f"median of {len(runs)} fresh processes: {statistics.median(medians):.2f} ms "
        f"(range {min(medians):.2f}-{max(medians):.2f} ms; target <= 1.0 ms)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
