"""`python -m serving doctor --metrics URL`: record a window of a live
server's metrics (or read a recorded trace) and print the likely causes."""

from __future__ import annotations

import argparse
from pathlib import Path

from .diagnose import REPORT_SCORE, Finding, diagnose, idle
from .intervals import intervals
from .trace import load, record, save


def add_parser(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor",
        help="watch a live server's metrics and name the likely causes of slow or "
        "timed-out requests, with their evidence",
    )
    source = doctor.add_mutually_exclusive_group(required=True)
    source.add_argument("--metrics", help="a Triton metrics URL, e.g. http://127.0.0.1:8002/metrics")
    source.add_argument("--trace", type=Path, help="diagnose a trace recorded with --record")
    doctor.add_argument("--window", type=float, default=60.0, help="seconds to watch (default 60)")
    doctor.add_argument("--interval", type=float, default=1.0, help="seconds between scrapes (default 1)")
    doctor.add_argument("--record", type=Path, help="also save the trace here (JSON lines)")
    doctor.set_defaults(func=run)


def render(findings: list[Finding], seconds: float) -> str:
    named = [f for f in findings if f.score >= REPORT_SCORE]
    lines = [f"watched {seconds:.0f} s of metrics"]
    if not named:
        lines.append("no cause stands out: batching, prefill interference and KV pressure look normal")
    for rank, finding in enumerate(named, 1):
        lines.append(f"{rank}. {finding.title} (score {finding.score:.2f})")
        lines += [f"     evidence: {line}" for line in finding.evidence]
        lines.append(f"     what to do: {finding.advice}")
    others = [f"{f.cause} {f.score:.2f}" for f in findings if f.score < REPORT_SCORE]
    if others:
        lines.append("not indicated: " + ", ".join(others))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.window <= 0 or args.interval <= 0:
        raise SystemExit("error: --window and --interval must be > 0")
    if args.trace is not None:
        try:
            samples = load(args.trace)
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"error: --trace {args.trace}: {exc!r}") from None
    else:
        print(f"watching {args.metrics} for {args.window:.0f} s ...", flush=True)
        try:
            samples = record(args.metrics, args.window, args.interval)
        except ConnectionError as exc:
            raise SystemExit(f"error: {exc}") from None
        if args.record is not None:
            save(samples, args.record)
    spans = intervals(samples)
    if not spans:
        raise SystemExit("error: the trace has fewer than two scrapes")
    if idle(spans):
        print(f"watched {samples[-1].t - samples[0].t:.0f} s: the server was idle (no requests); run it under load")
        return 0
    print(render(diagnose(spans), samples[-1].t - samples[0].t))
    return 0
