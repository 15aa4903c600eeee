"""The subcommands `python -m serving render-k8s | probe | drain` (added to
serving/cli.py's parser by `add_commands`)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..paths import BUILD_DIR


def add_commands(sub: argparse._SubParsersAction) -> None:
    render = sub.add_parser("render-k8s", help="render the Kubernetes manifests from the settings (cpu or gpu profile)")
    render.add_argument("--profile", choices=("cpu", "gpu"), default="cpu")
    render.add_argument("--out", help="the folder to write (default <build>/k8s/<profile>)")
    render.add_argument(
        "--settings", metavar="FILE.toml", help="a settings file ([engine], [text], [server], [gateway])"
    )
    render.add_argument(
        "--set",
        action="append",
        metavar="SECTION.FIELD=VALUE",
        help="override a setting (repeatable), e.g. --set gateway.drain_timeout_s=120",
    )
    render.add_argument(
        "--k8s",
        action="append",
        metavar="FIELD=VALUE",
        help="override a profile field (repeatable), e.g. --k8s image=registry/triton-llm:1 "
        "--k8s triton_max_replicas=16 --k8s inference_pool=true",
    )
    render.add_argument(
        "--golden",
        metavar="FILE.json",
        help="the probe's golden answer for engine.model_dir (python -m serving prepare-model "
        "--model-dir ...), shipped in a ConfigMap; default: the images' own, for the default "
        "model",
    )
    render.set_defaults(func=cmd_render_k8s)

    probe = sub.add_parser("probe", help="readiness with an inference check of one tritonserver (exit 0: ready)")
    probe.add_argument("--grpc-url", help="default 127.0.0.1:$LLM_TRITON_GRPC_PORT (8001)")
    probe.add_argument(
        "--golden",
        metavar="FILE.json",
        help="default <build>/probe/<model>.json (serve writes it); missing: any full answer passes",
    )
    probe.add_argument("--timeout-s", type=float, default=20.0, help="for the answer (default %(default)s)")
    probe.add_argument("--settings", metavar="FILE.toml", help="where engine.model_dir may be set")
    probe.set_defaults(func=cmd_probe)

    drain = sub.add_parser("drain", help="preStop: wait, then wait until the local engine has no request left")
    drain.add_argument("--metrics-url", help="default http://127.0.0.1:$LLM_TRITON_METRICS_PORT/metrics (8002)")
    drain.add_argument(
        "--delay-s",
        type=float,
        default=0.0,
        help="first keep serving this long (the gateways' DNS refresh) (default %(default)s)",
    )
    drain.add_argument(
        "--timeout-s", type=float, default=30.0, help="at most this long for the requests (default %(default)s)"
    )
    drain.add_argument("--interval-s", type=float, default=1.0)
    drain.set_defaults(func=cmd_drain)


def cmd_render_k8s(args: argparse.Namespace) -> int:
    from ..settings import DeploymentSettings, SettingsError
    from .profile import ProfileError, load_profile
    from .render import render, write
    from .settings_env import DEFAULT_MODEL_DIR

    try:
        profile = load_profile(args.profile, args.k8s or [])
        settings = DeploymentSettings.load(
            settings_file=args.settings, assignments=args.set or [], default_model_dir=lambda: DEFAULT_MODEL_DIR
        )
        manifests = render(settings, profile, Path(args.golden) if args.golden else None)
    except (SettingsError, ProfileError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    out = Path(args.out) if args.out else BUILD_DIR / "k8s" / profile.name
    header = (
        f"# Rendered by `python -m serving render-k8s --profile {profile.name}` from the deployment settings;\n"
        f"# change the settings (or --k8s profile fields) and render again, never this file.\n"
    )
    for path in write(manifests, out, header):
        print(path)
    return 0


def cmd_probe(args: argparse.Namespace) -> int:
    from .probe_command import main

    return main(args)


def cmd_drain(args: argparse.Namespace) -> int:
    from .drain import main

    return main(args)
