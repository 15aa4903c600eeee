"""`python -m serving`: prepare the default model, render the repository, serve."""
from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from .default_model import resolve_model_dir
from .launcher import (ADMIN_KEY_ENV, ADMIN_KEY_HEADER, DEFAULT_ADDRESS, RESTRICTED_APIS, LaunchOptions, TritonServer,
                       TritonStartError, exposure_warning)
from .paths import BUILD_DIR, REPO_ROOT
from .repository import render_repository
from .settings import DeploymentSettings, SettingsError
from .triton_binary import TritonSetupError


def _settings_from_args(args: argparse.Namespace) -> DeploymentSettings:
    overrides = {"engine.model_dir": str(resolve_model_dir(args.model_dir))} if args.model_dir else {}
    try:
        return DeploymentSettings.load(settings_file=args.settings, assignments=args.set or [],
                                       default_model_dir=lambda: str(resolve_model_dir(None)), **overrides)
    except SettingsError as exc:
        raise SystemExit(f"error: {exc}") from None


def _curl_example(server: TritonServer) -> str:
    body = {"text_input": "", "messages": json.dumps([{"role": "user", "content": "What is the capital of France?"}]),
            "max_tokens": 32, "temperature": 0.0, "stream": True}
    return (f"curl -N -X POST {server.http_url}/v2/models/ensemble/generate_stream \\\n"
            f"     -H 'Content-Type: application/json' \\\n     -d '{json.dumps(body)}'")


def _admin_key_from_args(args: argparse.Namespace) -> str | None:
    """--admin-key-file, else $LLM_TRITON_ADMIN_KEY, else None (the launcher makes one)."""
    if args.admin_key_file:
        try:
            return Path(args.admin_key_file).read_text().strip()
        except OSError as exc:
            raise SystemExit(f"--admin-key-file: {exc}") from None
    return os.environ.get(ADMIN_KEY_ENV, "").strip() or None


def _ready_banner(server: TritonServer) -> str:
    return (f"\nready.\n  HTTP     {server.http_url}  (generate, generate_stream)\n"
            f"  gRPC     {server.grpc_url}  (ModelStreamInfer)\n  metrics  {server.metrics_url}\n"
            f"  admin    key in {server.admin_key_path}  (header {ADMIN_KEY_HEADER}: {', '.join(RESTRICTED_APIS)})\n"
            f"\ntry:\n{_curl_example(server)}\n\nCtrl-C stops the server.")


def cmd_serve(args: argparse.Namespace) -> int:
    options = LaunchOptions(settings=_settings_from_args(args), http_port=args.http_port, grpc_port=args.grpc_port,
                            metrics_port=args.metrics_port, address=args.address,
                            admin_key=_admin_key_from_args(args),
                            log_file=Path(args.log_file) if args.log_file else None,
                            repository_source=Path(args.model_repository))
    try:
        server = TritonServer(options)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    warning = exposure_warning(options.address)
    if warning:
        print(f"WARNING: {warning}", flush=True)
    print(f"starting tritonserver (model {options.settings.engine.model_dir}); log: {server.log_path}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except (TritonStartError, TritonSetupError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(_ready_banner(server), flush=True)
    while not stop.wait(0.5):
        if server.process is None or server.process.poll() is not None:
            code = server.process.returncode if server.process else 1
            print(f"tritonserver exited on its own (code {code}); see {server.log_path}", file=sys.stderr)
            server.stop()
            return code or 1
    print("stopping tritonserver...", flush=True)
    code = server.stop()
    print(f"stopped (exit code {code}).")
    return 0


def cmd_prepare_model(args: argparse.Namespace) -> int:
    print(resolve_model_dir(args.model_dir))
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    target = Path(args.output)
    render_repository(_settings_from_args(args), target, source=Path(args.model_repository))
    print(target)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    def model_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model-dir", help="a local HF causal-LM folder (default: $LLM_MODEL_DIR or SmolLM2-135M)")
        p.add_argument("--settings", metavar="FILE.toml",
                       help="a settings file with [engine], [text] and [server] tables")
        p.add_argument("--set", action="append", metavar="SECTION.FIELD=VALUE",
                       help="override a setting, e.g. --set engine.dtype=bfloat16 (repeatable; beats the "
                            "settings file and LLM__SECTION__FIELD environment variables)")

    serve = sub.add_parser("serve", help="run tritonserver in the foreground")
    model_args(serve)
    serve.add_argument("--http-port", type=int, default=8000)
    serve.add_argument("--grpc-port", type=int, default=8001)
    serve.add_argument("--metrics-port", type=int, default=8002)
    serve.add_argument("--address", default=DEFAULT_ADDRESS,
                       help="where Triton's HTTP, gRPC and metrics ports listen (default %(default)s: loopback; "
                            "anything else belongs behind the gateway or on a trusted private network)")
    serve.add_argument("--admin-key-file", metavar="PATH",
                       help=f"the key for Triton's admin APIs (header {ADMIN_KEY_HEADER}); default ${ADMIN_KEY_ENV}, "
                            f"else a fresh random one; the key in effect is written to <build>/admin_key (0600)")
    serve.add_argument("--log-file", help=f"server log (default {BUILD_DIR}/tritonserver.log)")
    serve.add_argument("--model-repository", default=str(REPO_ROOT / "model_repository"),
                       help="the template repository to render and serve")
    serve.set_defaults(func=cmd_serve)

    prep = sub.add_parser("prepare-model", help="convert the default model once; print its folder")
    prep.add_argument("--model-dir")
    prep.set_defaults(func=cmd_prepare_model)

    render = sub.add_parser("render", help="render the model repository for another deployment")
    model_args(render)
    render.add_argument("--output", default=str(BUILD_DIR / "model_repository"))
    render.add_argument("--model-repository", default=str(REPO_ROOT / "model_repository"),
                        help="the template repository to render")
    render.set_defaults(func=cmd_render)

    args = parser.parse_args(argv)
    return args.func(args)
