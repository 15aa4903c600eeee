"""Command line: `python -m loadtest run ...` and `python -m loadtest report ...`."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence

from .report import SloSpec
from .runner import report, run
from .settings import SHAPES, LoadSettings

# Locust user class names (loadtest/users.py); not imported here because
# importing locust monkey-patches the runner process for gevent.
USER_TYPES = {"sse": "SseUser", "grpc": "GrpcUser", "openai": "OpenAIUser"}


def parse_duration(text: str) -> float:
    """'90', '90s', '2m', '1h30m' -> seconds."""
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+(?:\.\d+)?)s?)?", text.strip())
    if not text.strip() or not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 60s, 2m)")
    hours, minutes, seconds = match.groups()
    return int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds or 0)


def _add_slos(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--slo-ttft-p99-ms", type=float, default=None)
    parser.add_argument("--slo-itl-p99-ms", type=float, default=None)
    parser.add_argument("--slo-error-rate", type=float, default=None, help="e.g. 0.01 for 1%%")


def _slos(args: argparse.Namespace) -> SloSpec:
    return SloSpec(args.slo_ttft_p99_ms, args.slo_itl_p99_ms, args.slo_error_rate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m loadtest")
    sub = parser.add_subparsers(dest="command", required=True)
    run_p = sub.add_parser("run", help="run Locust headless and report")
    run_p.add_argument("--users", type=int, default=4)
    run_p.add_argument("--spawn-rate", type=float, default=None, help="default: users per second = users")
    run_p.add_argument("--duration", type=parse_duration, default=60.0)
    run_p.add_argument("--shape", choices=SHAPES, default="steady")
    run_p.add_argument("--burst-factor", type=float, default=10.0)
    run_p.add_argument(
        "--user-types",
        default="sse,grpc",
        help="comma list of: sse, grpc, openai (the gateway's OpenAI API; key in $OPENAI_API_KEY)",
    )
    run_p.add_argument("--burst-silence", action="store_true", help="chat-like users: turns in bursts, then quiet")
    run_p.add_argument("--cancel-share", type=float, default=0.0)
    run_p.add_argument("--model", choices=("ensemble", "llm_bls"), default="ensemble")
    run_p.add_argument("--http-url", default="http://127.0.0.1:8000")
    run_p.add_argument("--grpc-url", default="127.0.0.1:8001")
    run_p.add_argument("--openai-url", default="http://127.0.0.1:9000/v1", help="the gateway's OpenAI base URL")
    run_p.add_argument("--max-tokens", type=int, default=64)
    run_p.add_argument("--fixed-max-tokens", action="store_true")
    run_p.add_argument(
        "--raw-prompts", action="store_true", help="send prompts as plain text_input instead of chat messages"
    )
    run_p.add_argument("--think-time", type=float, default=0.5)
    run_p.add_argument("--token-timeout", type=float, default=30.0)
    run_p.add_argument("--dataset", default=None)
    run_p.add_argument("--tokenizer-dir", default="", help="model folder with tokenizer.json (default model if empty)")
    run_p.add_argument("--stop-timeout", type=float, default=30.0, help="grace for in-flight streams at the end")
    run_p.add_argument("--out", default="results")
    _add_slos(run_p)
    report_p = sub.add_parser("report", help="summarize an earlier run's output folder")
    report_p.add_argument("--out", default="results")
    _add_slos(report_p)
    return parser


def user_classes(user_types: str, burst_silence: bool) -> list[str]:
    names = []
    for kind in filter(None, (t.strip().lower() for t in user_types.split(","))):
        if kind not in USER_TYPES:
            raise SystemExit(f"unknown user type {kind!r}; choose from {sorted(USER_TYPES)}")
        name = USER_TYPES[kind]
        names.append(name.replace("User", "BurstSilenceUser") if burst_silence else name)
    if not names:
        raise SystemExit("no user types given")
    return names


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "report":
        return report(args.out, _slos(args))
    settings_kwargs = dict(
        http_url=args.http_url,
        grpc_url=args.grpc_url,
        openai_url=args.openai_url,
        model=args.model,
        shape=args.shape,
        users=args.users,
        spawn_rate=args.spawn_rate or float(args.users),
        duration_s=args.duration,
        burst_factor=args.burst_factor,
        cancel_share=args.cancel_share,
        think_time_s=args.think_time,
        max_tokens=args.max_tokens,
        fixed_max_tokens=args.fixed_max_tokens,
        chat=not args.raw_prompts,
        token_timeout_s=args.token_timeout,
        tokenizer_dir=args.tokenizer_dir,
    )
    if args.dataset:
        settings_kwargs["dataset"] = args.dataset
    return run(
        LoadSettings(**settings_kwargs),
        user_classes(args.user_types, args.burst_silence),
        args.out,
        _slos(args),
        args.stop_timeout,
    )
