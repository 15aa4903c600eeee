"""`python -m serving build-trtllm` and `python -m serving launch-trtllm`.
Where the machine lacks what they need (TensorRT-LLM, a GPU, Triton's
TensorRT-LLM backend, mpirun) they say so in one line and exit 1, before
anything slow (such as preparing the default model) runs."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

from ..launcher import DEFAULT_ADDRESS, LaunchOptions
from ..paths import BUILD_DIR, REPO_ROOT
from ..settings_args import add_settings_args, settings_from_args
from .environment import EnvironmentMissing, require_triton_backend
from .versions import CONTAINER_TRITONSERVER, TENSORRT_LLM_VERSION

EXIT_MISSING = 1


def _missing(command: str, exc: EnvironmentMissing) -> int:
    print(f"{command}: {exc}", file=sys.stderr)
    return EXIT_MISSING


def cmd_build(args: argparse.Namespace) -> int:
    from python_llm.engine.worker.model_info import ModelInfo

    from .build import build_command, convert_command, find_toolchain, plan_build

    try:
        tools = find_toolchain(args.tp, args.pp, args.python)
    except EnvironmentMissing as exc:
        return _missing("build-trtllm", exc)
    settings = settings_from_args(args)
    engine = settings.engine
    max_seq_len = ModelInfo.from_model_dir(engine.model_dir, engine.max_model_len).max_model_len
    plan = plan_build(engine, max_seq_len, args.tp, args.pp, args.dtype, Path(args.output) if args.output else None)
    steps = [("checkpoint", convert_command(plan, tools)), ("engine", build_command(plan, tools))]
    print(
        f"build-trtllm: TensorRT-LLM {tools.version} ({tools.python}), tp {plan.tp} x pp {plan.pp} on "
        f"{tools.gpus} GPUs -> {plan.engine_dir}",
        flush=True,
    )
    for name, command in steps:
        print(f"  {name}: {shlex.join(command)}", flush=True)
        if args.dry_run:
            continue
        code = subprocess.call(command)
        if code != 0:
            print(f"build-trtllm: the {name} step failed (exit code {code})", file=sys.stderr)
            return code
    if not args.dry_run:
        print(f"build-trtllm: engine ready in {plan.engine_dir}", flush=True)
    return 0


def cmd_launch(args: argparse.Namespace) -> int:
    from .launch import prepare, run

    try:
        require_triton_backend(args.tritonserver)  # before anything slow
        settings = settings_from_args(args)
        options = LaunchOptions(
            settings=settings,
            http_port=args.http_port,
            grpc_port=args.grpc_port,
            metrics_port=args.metrics_port,
            address=args.address,
            work_dir=Path(args.work_dir),
            repository_source=Path(args.model_repository),
        )
        command, env, shape = prepare(
            settings, options, Path(args.engine_dir) if args.engine_dir else None, args.tritonserver, args.orchestrator
        )
    except EnvironmentMissing as exc:
        return _missing("launch-trtllm", exc)
    mode = "orchestrator" if args.orchestrator else "leader"
    print(
        f"launch-trtllm: tp {shape.tp} x pp {shape.pp} = {shape.world_size} ranks ({mode} mode)\n"
        f"  {' '.join(f'{k}={v}' for k, v in env.items())} {shlex.join(command)}".rstrip(),
        flush=True,
    )
    if args.dry_run:
        return 0
    return run(command, env)


def add_parsers(sub: argparse._SubParsersAction) -> None:
    def model_args(p: argparse.ArgumentParser) -> None:
        add_settings_args(p)
        p.add_argument("--dry-run", action="store_true", help="check the machine and print the commands only")

    build = sub.add_parser(
        "build-trtllm",
        help=f"build the TensorRT-LLM engine (tensorrt-llm {TENSORRT_LLM_VERSION}) for the "
        f"tensorrt_llm variant, with TP x PP ranks",
    )
    model_args(build)
    build.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default %(default)s)")
    build.add_argument("--pp", type=int, default=1, help="pipeline-parallel size (default %(default)s)")
    build.add_argument("--dtype", default="auto", help="checkpoint dtype: auto (the model's), float16, bfloat16")
    build.add_argument(
        "--output", help="engine folder (default <model_dir>/tensorrt_llm_engine, where the rendered repository looks)"
    )
    build.add_argument(
        "--python", help="the Python that has tensorrt_llm (default: this one, python3, /usr/bin/python3)"
    )
    build.set_defaults(func=cmd_build)

    launch = sub.add_parser(
        "launch-trtllm",
        help="serve the tensorrt_llm variant: one tritonserver per rank of "
        "the engine's TP x PP (mpirun), or --orchestrator",
    )
    model_args(launch)
    launch.add_argument("--engine-dir", help="the engine folder (default <model_dir>/tensorrt_llm_engine)")
    launch.add_argument(
        "--orchestrator",
        action="store_true",
        help="one tritonserver; the backend spawns the ranks (TRTLLM_ORCHESTRATOR=1)",
    )
    launch.add_argument("--tritonserver", default=CONTAINER_TRITONSERVER, help="default %(default)s")
    launch.add_argument("--http-port", type=int, default=8000)
    launch.add_argument("--grpc-port", type=int, default=8001)
    launch.add_argument("--metrics-port", type=int, default=8002)
    launch.add_argument("--address", default=DEFAULT_ADDRESS, help="where rank 0 listens (default %(default)s)")
    launch.add_argument(
        "--work-dir",
        default=str(BUILD_DIR / "trtllm"),
        help="rendered repository, backends, admin key (default %(default)s)",
    )
    launch.add_argument(
        "--model-repository", default=str(REPO_ROOT / "model_repository"), help="the template repository to render"
    )
    launch.set_defaults(func=cmd_launch)
