"""`python -m serving`: prepare the default model (and the inference probe's
golden answer), render the repository, serve (one or several tritonservers on
loopback, the gateway's OpenAI API in front of them)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from gateway.config import GatewayConfig

from .capacity.command import add_parser as add_plan_command
from .default_model import resolve_model_dir
from .deploy.cli import add_commands as add_deploy_commands
from .doctor.command import add_parser as add_doctor_command
from .fleet import FleetStartError, ReplicaProcess, ReplicaProcesses, gateway_assignments, plan_replicas
from .gateway_process import GatewayProcess, GatewayStartError
from .launcher import (
    ADMIN_KEY_ENV,
    ADMIN_KEY_HEADER,
    DEFAULT_ADDRESS,
    RESTRICTED_APIS,
    LaunchOptions,
    TritonServer,
    exposure_warning,
)
from .paths import BUILD_DIR, REPO_ROOT
from .probe_golden import ensure_golden
from .repository import render_repository
from .settings import DeploymentSettings
from .settings_args import add_settings_args, settings_from_args
from .settings_reference import add_parser as add_settings_command
from .supervisor import Backoff, Supervisor, reclaim_stale_gateway
from .trtllm.command import add_parsers as add_trtllm_commands

# the ready banner's last line: what a supervisor (or a test) waits for
BANNER_END = "Ctrl-C stops the server."


def _curl_example(server: TritonServer) -> str:
    body = {
        "text_input": "",
        "messages": json.dumps([{"role": "user", "content": "What is the capital of France?"}]),
        "max_tokens": 32,
        "temperature": 0.0,
        "stream": True,
    }
    return (
        f"curl -N -X POST {server.http_url}/v2/models/ensemble/generate_stream \\\n"
        f"     -H 'Content-Type: application/json' \\\n     -d '{json.dumps(body)}'"
    )


def _admin_key_from_args(args: argparse.Namespace) -> str | None:
    """--admin-key-file, else $LLM_TRITON_ADMIN_KEY, else None (the launcher makes one)."""
    if args.admin_key_file:
        try:
            return Path(args.admin_key_file).read_text().strip()
        except OSError as exc:
            raise SystemExit(f"--admin-key-file: {exc}") from None
    return os.environ.get(ADMIN_KEY_ENV, "").strip() or None


def _triton_lines(server: TritonServer) -> str:
    return (
        f"  HTTP     {server.http_url}  (generate, generate_stream)\n"
        f"  gRPC     {server.grpc_url}  (ModelStreamInfer)\n  metrics  {server.metrics_url}\n"
        f"  admin    key in {server.admin_key_path}  (header {ADMIN_KEY_HEADER}: {', '.join(RESTRICTED_APIS)})\n"
    )


def _fleet_lines(fleet: ReplicaProcesses, golden: Path | None) -> str:
    """One replica: today's lines. Several: each replica's, under its name."""
    if len(fleet.replicas) == 1:
        return _triton_lines(fleet.servers[0])
    blocks = []
    for replica in fleet.replicas:
        lines = _triton_lines(replica.server).splitlines()
        blocks.append("\n".join([f"  {replica.name:<3}{lines[0]}", *(f"     {line}" for line in lines[1:])]))
    threads = fleet.servers[0].options.settings.engine.num_threads
    probe = f"  probe  golden answer in {golden}\n" if golden else "  probe  no golden answer: readiness only\n"
    return f"  {len(fleet.replicas)} replicas, engine.num_threads={threads} each\n" + "\n".join(blocks) + "\n" + probe


def _ready_banner(fleet: ReplicaProcesses, golden: Path | None) -> str:
    return f"\nready.\n{_fleet_lines(fleet, golden)}\ntry:\n{_curl_example(fleet.servers[0])}\n\n{BANNER_END}"


def _gateway_banner(
    fleet: ReplicaProcesses, golden: Path | None, gateway: GatewayConfig, log_path: Path, key: str | None
) -> str:
    base_url = f"http://127.0.0.1:{gateway.port}/v1"
    if key is None:
        key_line = (
            "  API key     the local key was revoked; create one with "
            "`.venv/bin/python -m gateway keys create --tier paid`\n"
        )
        shown = "<your key>"
    else:
        key_line = f"  API key     {key}  (local key, tier paid; python -m gateway keys list|create|revoke)\n"
        shown = key
    body = {
        "model": "ensemble",
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 32,
        "temperature": 0,
        "stream": True,
    }
    curl = (
        f"curl -N {base_url}/chat/completions \\\n     -H 'Authorization: Bearer {shown}' \\\n"
        f"     -H 'Content-Type: application/json' \\\n     -d '{json.dumps(body)}'"
    )
    python = (
        f'from openai import OpenAI\nclient = OpenAI(base_url="{base_url}", api_key="{shown}")\n'
        'answer = client.chat.completions.create(model="ensemble", messages=[{"role": "user", '
        '"content": "What is the capital of France?"}])\nprint(answer.choices[0].message.content)'
    )
    if gateway.public_grpc_port:
        grpc_line = (
            f"  gRPC        127.0.0.1:{gateway.public_grpc_port}  (KServe v2 for ensemble / llm_bls, "
            f"listening on {gateway.host}:{gateway.public_grpc_port}; metadata authorization: Bearer <key>)\n"
        )
    else:
        grpc_line = "  gRPC        off (gateway.public_grpc_port = 0)\n"
    return (
        f"\nready.\n  OpenAI API  {base_url}  (the gateway, listening on {gateway.host}:{gateway.port}; "
        f"log {log_path})\n"
        f"  Triton API  http://127.0.0.1:{gateway.port}/v2/models/{{ensemble,llm_bls}}/generate[_stream] | infer\n"
        f"{grpc_line}{key_line}{_ops_line(gateway)}"
        f"  Triton, behind it on loopback:\n{_fleet_lines(fleet, golden)}"
        f"\ntry:\n{curl}\n\n{python}\n\n{BANNER_END}"
    )


def _ops_line(gateway: GatewayConfig) -> str:
    """Where /metrics and /admin/* are: the ops listener, never the public port."""
    if not gateway.ops_port:
        return "  Ops         off (gateway.ops_port = 0): no /metrics, no /admin/*\n"
    from gateway.ops.admin import admin_key_path

    host = "127.0.0.1" if gateway.ops_host in ("0.0.0.0", "::", "") else gateway.ops_host
    url = f"http://[{host}]:{gateway.ops_port}" if ":" in host else f"http://{host}:{gateway.ops_port}"
    return (
        f"  Ops         {url}/metrics, {url}/admin/*  (listening on {gateway.ops_host}:{gateway.ops_port}, "
        f"not the public port; admin: Bearer key in {admin_key_path(gateway)})\n"
    )


def _local_key(gateway: GatewayConfig) -> str | None:
    """The key the banner's examples carry: created on the first run, reused after."""
    from gateway.admission.keys import ensure_local_key, resolve_keys_file

    return ensure_local_key(resolve_keys_file(gateway.keys_file))


def _start_gateway(
    args: argparse.Namespace, fleet: ReplicaProcesses, golden: Path | None, gateway: GatewayConfig
) -> GatewayProcess:
    # the child reads the same settings sources; its upstreams are these replicas
    # (and the ops port as resolved here, so that the banner and the child agree)
    process = GatewayProcess(
        [*(args.set or []), *gateway_assignments(fleet.replicas, golden), f"gateway.ops_port={gateway.ops_port}"],
        log_path=BUILD_DIR / "gateway.log",
        settings_file=args.settings,
        port=gateway.port,
    )
    process.start()
    return process


def _golden(settings: DeploymentSettings) -> Path | None:
    """The probe's golden answer for the served model (computed once, a few
    seconds); without it the gateway still probes readiness."""
    try:
        return ensure_golden(settings.engine.model_dir, settings.engine, isolated=True)
    except Exception as exc:  # the probe is a safety net, not a reason to refuse serving
        print(f"WARNING: no probe golden answer ({exc}); the gateway will check readiness only", flush=True)
        return None


def _announce(replicas: list[ReplicaProcess], options: LaunchOptions) -> None:
    model = options.settings.engine.model_dir
    if len(replicas) == 1:
        print(f"starting tritonserver (model {model}); log: {replicas[0].server.log_path}", flush=True)
        return
    threads = replicas[0].server.options.settings.engine.num_threads
    print(f"starting {len(replicas)} tritonservers (model {model}, engine.num_threads={threads} each)", flush=True)
    for replica in replicas:
        o = replica.server.options
        print(
            f"  {replica.name}: HTTP {o.http_port}, gRPC {o.grpc_port}, metrics {o.metrics_port}; "
            f"log: {replica.server.log_path}",
            flush=True,
        )


def _report_ready(replica: ReplicaProcess, seconds: float) -> None:
    print(f"  {replica.name} ready in {seconds:.1f} s", flush=True)


def cmd_serve(args: argparse.Namespace) -> int:
    options = LaunchOptions(
        settings=settings_from_args(args),
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        address=args.address,
        admin_key=_admin_key_from_args(args),
        log_file=Path(args.log_file) if args.log_file else None,
        repository_source=Path(args.model_repository),
    )
    try:
        fleet = ReplicaProcesses(plan_replicas(options, args.replicas))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    warning = exposure_warning(options.address)
    if warning:
        print(f"WARNING: {warning}", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    golden = _golden(options.settings)
    _announce(fleet.replicas, options)
    try:
        fleet.start(stop, on_ready=_report_ready if len(fleet.replicas) > 1 else lambda r, s: None)
    except FleetStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except InterruptedError:
        print("stopped before every replica was ready.", flush=True)
        return 0
    gateway: GatewayProcess | None = None
    metrics_port = options.settings.server.supervisor_metrics_port
    if metrics_port and Supervisor.serve_metrics(metrics_port):
        print(
            f"serve's own metrics: http://127.0.0.1:{metrics_port}/metrics (serving_replica_restarts_total, "
            f"serving_replica_up)",
            flush=True,
        )
    if args.no_gateway:
        print(_ready_banner(fleet, golden), flush=True)
    else:
        config = options.settings.gateway
        reclaim_stale_gateway(fleet.servers[0].grpc_url)
        try:
            gateway = _start_gateway(args, fleet, golden, config)
        except GatewayStartError as exc:
            print(f"error: {exc}", file=sys.stderr)
            fleet.stop()
            return 1
        print(_gateway_banner(fleet, golden, config, gateway.log_path, _local_key(config)), flush=True)
    supervisor = (
        Supervisor(fleet, Backoff.from_settings(options.settings.server))
        if options.settings.server.restart_replicas
        else None
    )
    code = _watch(fleet, gateway, stop, supervisor)
    if supervisor is not None:
        supervisor.stop()
    return _stop_all(fleet, gateway, options.settings.gateway, code)


def _stop_all(fleet: ReplicaProcesses, gateway: GatewayProcess | None, config: GatewayConfig, code: int) -> int:
    """The gateway first, so it drains its streams while the replicas still
    answer; then every replica. Each step says what it waits for."""
    if gateway is not None:
        print(
            f"stopping the gateway... (it finishes the requests it admitted, up to {config.drain_timeout_s:g} s)",
            flush=True,
        )
        t0 = time.monotonic()
        gateway.stop(timeout_s=config.drain_timeout_s + 10.0)
        print(f"  gateway stopped in {time.monotonic() - t0:.1f} s", flush=True)
    server = fleet.servers[0]
    waits = (
        f"(each waits up to {server.options.settings.server.exit_timeout_s} s for its in-flight inferences, "
        f"then unloads its models; killed after {server.stop_timeout_s:g} s)"
    )
    t0 = time.monotonic()
    if len(fleet.replicas) == 1:
        print(f"stopping tritonserver... {waits}", flush=True)
        print(f"stopped (exit code {fleet.stop()[fleet.replicas[0].name]}) in {time.monotonic() - t0:.1f} s.")
    else:
        print(f"stopping {len(fleet.replicas)} tritonservers... {waits}", flush=True)
        codes = fleet.stop()
        print(
            f"stopped (exit codes {', '.join(f'{name} {c}' for name, c in codes.items())}) in "
            f"{time.monotonic() - t0:.1f} s."
        )
    return code


def _watch(
    fleet: ReplicaProcesses, gateway: GatewayProcess | None, stop: threading.Event, supervisor: Supervisor | None
) -> int:
    """Until Ctrl-C (0), or until the gateway dies on its own (its code, or
    1). A replica that exits is restarted (serving/supervisor.py); routing
    around it meanwhile is the gateway's job. Without a supervisor
    (`server.restart_replicas = false`), a replica that exits ends serve with
    its code."""
    while not stop.wait(0.5):
        if supervisor is not None:
            supervisor.poll()
        else:
            for replica, code in fleet.dead():
                print(
                    f"replica {replica.name}: tritonserver exited on its own (code {code}); see "
                    f"{replica.server.log_path}; not restarted (server.restart_replicas is false)",
                    file=sys.stderr,
                    flush=True,
                )
                return code or 1
        if gateway is not None and not gateway.alive():
            code = gateway.process.returncode if gateway.process else 1
            print(f"the gateway exited on its own (code {code}); see {gateway.log_path}", file=sys.stderr)
            return code or 1
    return 0


def cmd_prepare_model(args: argparse.Namespace) -> int:
    model_dir = resolve_model_dir(args.model_dir)
    print(model_dir, flush=True)
    # stdout stays the model folder alone (scripts read it); the golden's path goes to stderr
    print(f"probe golden answer: {ensure_golden(model_dir)}", file=sys.stderr)
    return 0


def cmd_render(args: argparse.Namespace) -> int:
    target = Path(args.output)
    render_repository(settings_from_args(args), target, source=Path(args.model_repository))
    print(target)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run tritonserver(s) and the gateway in front of them, in the foreground")
    add_settings_args(serve)
    serve.add_argument(
        "--replicas",
        type=int,
        default=1,
        metavar="N",
        help="tritonservers to run (default %(default)s); replica i listens on the ports below "
        "+ 10*i, works in <build>/replicas/r<i> and gets engine.num_threads = usable cores // N "
        "unless that is set",
    )
    serve.add_argument("--http-port", type=int, default=8000, help="replica 0's (default %(default)s)")
    serve.add_argument("--grpc-port", type=int, default=8001, help="replica 0's (default %(default)s)")
    serve.add_argument("--metrics-port", type=int, default=8002, help="replica 0's (default %(default)s)")
    serve.add_argument(
        "--address",
        default=DEFAULT_ADDRESS,
        help="where Triton's HTTP, gRPC and metrics ports listen (default %(default)s: loopback; "
        "anything else belongs behind the gateway or on a trusted private network)",
    )
    serve.add_argument(
        "--admin-key-file",
        metavar="PATH",
        help=f"the key for Triton's admin APIs (header {ADMIN_KEY_HEADER}); default ${ADMIN_KEY_ENV}, "
        f"else a fresh random one; the key in effect is written to <build>/admin_key (0600)",
    )
    serve.add_argument("--log-file", help=f"server log (default {BUILD_DIR}/tritonserver.log)")
    serve.add_argument(
        "--no-gateway",
        action="store_true",
        help="serve Triton alone (no OpenAI API in front); by default the gateway starts on "
        "gateway.port (9000) with its log in <build>/gateway.log",
    )
    serve.add_argument(
        "--model-repository",
        default=str(REPO_ROOT / "model_repository"),
        help="the template repository to render and serve",
    )
    serve.set_defaults(func=cmd_serve)

    prep = sub.add_parser(
        "prepare-model",
        help="convert the default model once and record the inference probe's "
        "golden answer (<build>/probe/<model>.json); print the model folder",
    )
    prep.add_argument("--model-dir")
    prep.set_defaults(func=cmd_prepare_model)

    render = sub.add_parser("render", help="render the model repository for another deployment")
    add_settings_args(render)
    render.add_argument("--output", default=str(BUILD_DIR / "model_repository"))
    render.add_argument(
        "--model-repository", default=str(REPO_ROOT / "model_repository"), help="the template repository to render"
    )
    render.set_defaults(func=cmd_render)
    add_settings_command(sub)

    # deployment: render-k8s (the Kubernetes manifests), probe and drain (what the containers run)
    add_deploy_commands(sub)
    # operations: capacity planning and diagnosis of a live server
    add_plan_command(sub)
    add_trtllm_commands(sub)
    add_doctor_command(sub)

    args = parser.parse_args(argv)
    return args.func(args)
