"""`python -m gateway serve`: the gateway alone (uvicorn), in front of a Triton
reached over gRPC at `gateway.fleet.upstream_grpc_url`.
`python -m gateway keys create|list|revoke`: the API key store.

Settings come from the deployment settings' `gateway` section, read like the
rest (`--settings FILE`, `LLM__GATEWAY__*`, `--set gateway.field=value`), by
the gateway itself (lifecycle/settings.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

from layered_settings import SettingsError

from .config import GatewayConfig
from .lifecycle import settings


def load_config(settings_file: str | None, assignments: Sequence[str]) -> GatewayConfig:
    try:
        return settings.load_config(settings_file, assignments)
    except SettingsError as exc:
        raise SystemExit(f"error: {exc}") from None


def serve(config: GatewayConfig, log_level: str) -> int:
    import asyncio

    import uvicorn

    from .app import build_policy, create_app
    from .lifecycle.drain import DrainingServer
    from .ops import logs
    from .ops.server import OpsBindError, ops_server, serve_together

    logs.configure(log_level)
    app = create_app(config, build_policy(config))
    state = app.state
    try:
        ops = ops_server(config, app)  # /metrics and /admin/*: their own listener, bound first
    except OpsBindError as exc:
        logging.getLogger("gateway").error("%s", exc)
        return 1
    # access_log off: the gateway writes its own, with request ids and no secrets
    server = DrainingServer(
        uvicorn.Config(
            state.asgi,
            host=config.host,
            port=config.port,
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=10,
        ),
        state.drain,
        busy=lambda: state.fleet.in_flight() + state.streams.running(),
        drain_timeout_s=config.drain_timeout_s,
    )
    # SIGINT / SIGTERM drain first (lifecycle/drain.py), then uvicorn shuts down and
    # re-raises the signal to the handler it found: a no-op one makes a clean stop exit 0
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    # the loop uvicorn's own run() would pick
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(serve_together(server, ops))
    return 0 if server.started else 1


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["keys"]:
        from .admission.keys_cli import main as keys_main

        settings, rest = _split_settings(argv[1:])
        return keys_main(rest, config=load_config(settings.settings, settings.set or []))
    parser = argparse.ArgumentParser(
        prog="python -m gateway", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("serve", help="serve the OpenAI API in front of Triton")
    _settings_args(run)
    run.add_argument("--log-level", default="INFO", choices=("DEBUG", "INFO", "WARNING", "ERROR"))
    sub.add_parser("keys", help="manage API keys: keys create --tier T | keys list | keys revoke KEY_ID")
    args = parser.parse_args(argv)
    return serve(load_config(args.settings, args.set or []), args.log_level)


def _settings_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--settings", metavar="FILE.toml", help="a settings file (its [gateway] table is read)")
    parser.add_argument(
        "--set",
        action="append",
        metavar="gateway.FIELD=VALUE",
        help="override a gateway setting, e.g. --set gateway.port=9100 (repeatable)",
    )


def _split_settings(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(add_help=False)
    _settings_args(parser)
    return parser.parse_known_args(argv)


if __name__ == "__main__":
    raise SystemExit(main())
