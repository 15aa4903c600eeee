"""`python -m serving plan`: the options, the measurements (given, or read
from a `make bench` capacity record) and the plan with its reasoning."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .model import Measurement, Plan, PlanError, PlanInput, Redundancy, make_plan

EXAMPLE = (
    "python -m serving plan --peak-qps 10 --mean-output-tokens 500 --throughput 1:30 "
    "--throughput 64:2500 --redundancy 2N"
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    plan = sub.add_parser(
        "plan",
        help="replicas and GPUs for a peak load and an SLO, from measured throughput",
        description=f"Example (the article's exercise 1): {EXAMPLE}",
    )
    plan.add_argument("--peak-qps", type=float, required=True, help="requests per second at peak")
    plan.add_argument("--mean-output-tokens", type=float, required=True)
    plan.add_argument(
        "--mean-input-tokens",
        type=float,
        default=0.0,
        help="shown for context; the measured throughput must come from prompts of this size",
    )
    plan.add_argument(
        "--throughput",
        action="append",
        default=[],
        metavar="C:TOK_S[:TTFT_P90_S[:TPOT_S]]",
        help="one replica measured at concurrency C: output tokens/s of all its streams "
        "(repeat for each concurrency; C=1 is one request alone)",
    )
    plan.add_argument("--bench-json", type=Path, help="measurements from `make bench` (build/bench/capacity.json)")
    plan.add_argument("--ttft-p90-slo", type=float, help="seconds")
    plan.add_argument("--tpot-slo", type=float, help="seconds per output token, per stream")
    plan.add_argument("--redundancy", default="N+1", help="N+k spare replicas, or 2N (default N+1)")
    plan.add_argument(
        "--max-utilisation",
        type=float,
        default=1.0,
        help="plan the peak at this fraction of measured capacity (headroom), default 1.0",
    )
    plan.add_argument("--min-replicas", type=int, default=2, help="availability floor (default 2)")
    plan.add_argument("--gpus-per-replica", type=int, default=1, help="TP x PP")
    plan.set_defaults(func=run)


def parse_point(text: str) -> Measurement:
    parts = text.split(":")
    try:
        if not 2 <= len(parts) <= 4:
            raise ValueError
        numbers = [float(p) for p in parts]
    except ValueError:
        raise PlanError(f"--throughput: C:TOK_S[:TTFT_P90_S[:TPOT_S]], got {text!r}") from None
    if numbers[0] != int(numbers[0]):
        raise PlanError(f"--throughput: the concurrency must be a whole number, got {parts[0]!r}")
    return Measurement(int(numbers[0]), numbers[1], *numbers[2:])


def read_bench(path: Path) -> tuple[Measurement, ...]:
    try:
        record = json.loads(path.read_text())
        return tuple(
            Measurement(int(m["concurrency"]), float(m["output_tokens_per_s"]), m.get("ttft_p90_s"), m.get("tpot_s"))
            for m in record["measurements"]
        )
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PlanError(f"--bench-json: {path}: {exc!r}") from None


def plan_input(args: argparse.Namespace) -> PlanInput:
    points = tuple(parse_point(p) for p in args.throughput)
    if args.bench_json is not None:
        points += read_bench(args.bench_json)
    return PlanInput(
        peak_qps=args.peak_qps,
        mean_output_tokens=args.mean_output_tokens,
        mean_input_tokens=args.mean_input_tokens,
        measurements=points,
        ttft_p90_slo_s=args.ttft_p90_slo,
        tpot_slo_s=args.tpot_slo,
        redundancy=Redundancy.parse(args.redundancy),
        max_utilisation=args.max_utilisation,
        min_replicas=args.min_replicas,
        gpus_per_replica=args.gpus_per_replica,
    )


def explain(given: PlanInput, plan: Plan) -> str:
    point = plan.operating_point
    lines = [
        f"demand at peak: {given.peak_qps:g} req/s x {given.mean_output_tokens:g} output tokens "
        f"= {plan.demand_tokens_per_s:,.0f} output tokens/s"
        + (f" (prompts of {given.mean_input_tokens:g} tokens)" if given.mean_input_tokens else ""),
        f"naive, one request at a time: {plan.demand_tokens_per_s:,.0f} / {plan.single_stream_tokens_per_s:,.0f} "
        f"tokens/s per request = {plan.naive_replicas} replicas",
    ]
    for m, why in plan.rejected:
        lines.append(f"  concurrency {m.concurrency}: {m.output_tokens_per_s:,.0f} tokens/s misses the SLO ({why})")
    lines += [
        f"batched: a replica gives {point.output_tokens_per_s:,.0f} tokens/s at concurrency {point.concurrency} "
        f"(TPOT {point.time_per_output_token_s * 1000:.0f} ms"
        + (f", TTFT p90 {point.ttft_p90_s:.2f} s" if point.ttft_p90_s is not None else "")
        + ")",
        f"  throughput: {plan.demand_tokens_per_s:,.0f} / ({point.output_tokens_per_s:,.0f} x "
        f"{given.max_utilisation:g} utilisation) -> {plan.replicas_for_throughput} replicas",
        f"  concurrency (Little's law): {given.peak_qps:g} req/s x {plan.mean_latency_s:.1f} s per request "
        f"= {plan.concurrency_needed:,.0f} in flight / {point.concurrency} per replica -> "
        f"{plan.replicas_for_concurrency} replicas",
        f"needed at peak: N = {plan.replicas_needed}; with {given.redundancy} redundancy and at least "
        f"{given.min_replicas} for availability: {plan.replicas} replicas",
        f"GPUs: {plan.replicas} replicas x {given.gpus_per_replica} per replica (TP x PP) = {plan.gpus}",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    try:
        given = plan_input(args)
        print(explain(given, make_plan(given)))
    except PlanError as exc:
        raise SystemExit(f"error: {exc}") from None
    return 0
