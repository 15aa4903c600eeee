"""`python -m serving launch-trtllm`: Triton with the tensorrt_llm variant, run
with the world size its engine was built for (TP x PP, read from the engine's
config.json), the way TensorRT-LLM's own scripts/launch_triton_server.py
(tensorrtllm_backend v0.14.0) does it:

- leader mode (default): `mpirun -n 1 tritonserver ... : -n 1 tritonserver ...`,
  one tritonserver per rank; rank 0 loads the variant's models and serves,
  every other rank loads only the TensorRT-LLM model (`--model-control-mode=explicit
  --load-model=tensorrt_llm_engine`) and works for rank 0 over MPI; each rank's
  Python stubs get their own shared-memory prefix;
- orchestrator mode (`--orchestrator`, their `--multi-model`): one tritonserver
  with TRTLLM_ORCHESTRATOR=1; the backend spawns the TP x PP workers itself
  (`executor_worker_path`).

Rank 0 always loads by name (explicit model control): the rendered repository
also holds `python_llm`'s config, which this variant never loads."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..launcher import LaunchOptions, TritonServer, write_admin_key
from ..openmp_env import apply_openmp_defaults
from ..repository import render_repository, variant_models
from ..settings import DeploymentSettings
from ..triton_binary import find_triton, prepare_backends
from .engine_config import ENGINE_MODEL_NAME, default_engine_dir
from .environment import EnvironmentMissing, Probes, require_gpus, require_mpirun, require_triton_backend
from .versions import CONTAINER_BACKEND_DIR, CONTAINER_TRITONSERVER


@dataclass(frozen=True)
class EngineShape:
    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        return self.tp * self.pp


def engine_shape(engine_dir: Path) -> EngineShape:
    """TP and PP of a built engine, from its config.json (`pretrained_config.mapping`)."""
    config_path = Path(engine_dir) / "config.json"
    if not config_path.is_file():
        raise EnvironmentMissing(
            f"no TensorRT-LLM engine at {engine_dir} (config.json missing): build it with "
            f"`python -m serving build-trtllm --tp N --pp M`"
        )
    try:
        config = json.loads(config_path.read_text())
        mapping = config.get("pretrained_config", config).get("mapping", {})
        tp, pp = int(mapping.get("tp_size", 1)), int(mapping.get("pp_size", 1))
    except (ValueError, AttributeError) as exc:
        raise EnvironmentMissing(f"{config_path}: not a TensorRT-LLM engine config ({exc})") from None
    world = int(mapping.get("world_size", tp * pp))
    if world != tp * pp:
        raise EnvironmentMissing(f"{config_path}: world_size {world} is not tp {tp} x pp {pp}")
    return EngineShape(tp, pp)


def rank_args(rank: int, repository: Path, backends: Path, models: tuple[str, ...], base: list[str]) -> list[str]:
    """One rank's tritonserver arguments (after the binary). `base`: rank 0's
    serving flags (ports, addresses, restricted APIs, metrics)."""
    loaded = models if rank == 0 else (ENGINE_MODEL_NAME,)
    args = [
        f"--model-repository={repository}",
        f"--backend-directory={backends}",
        "--model-control-mode=explicit",
        *(f"--load-model={name}" for name in loaded),
        *base,
        "--disable-auto-complete-config",
        f"--backend-config=python,shm-region-prefix-name=prefix{rank}_",
    ]
    return args


def launch_command(
    tritonserver: str,
    shape: EngineShape,
    repository: Path,
    backends: Path,
    models: tuple[str, ...],
    base: list[str],
    orchestrator: bool,
    mpirun: str = "mpirun",
) -> tuple[list[str], dict[str, str]]:
    """The command and the extra environment."""
    if orchestrator or shape.world_size == 1:
        env = {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"} if orchestrator else {}
        return [tritonserver, *rank_args(0, repository, backends, models, base)], env
    command = [mpirun, "--allow-run-as-root"]
    for rank in range(shape.world_size):
        if rank:
            command.append(":")
        command += ["-n", "1", tritonserver, *rank_args(rank, repository, backends, models, base)]
    return command, {}


def _serving_flags(server: TritonServer) -> list[str]:
    """Rank 0's flags from the project's own launcher (ports, loopback
    addresses, restricted admin APIs, metrics), without its binary and paths."""
    own = server.command(Path("/repository"), Path("/backends"))[1:]
    # each rank names its own shm prefix (rank_args), never the launcher's
    return [a for a in own if not a.startswith(("--model-repository=", "--backend-directory=", "--backend-config="))]


def check_machine(shape: EngineShape, tritonserver: str, orchestrator: bool, probes: Probes = Probes()) -> str:
    """Triton with TensorRT-LLM's backend, mpirun when ranks > 1 (leader mode),
    GPUs for every rank; the mpirun to use. EnvironmentMissing otherwise."""
    require_triton_backend(tritonserver, probes)
    mpirun = "mpirun" if orchestrator or shape.world_size == 1 else require_mpirun(probes)
    require_gpus(shape.world_size, shape.tp, shape.pp, probes)
    return mpirun


def prepare(
    settings: DeploymentSettings,
    options: LaunchOptions,
    engine_dir: Path | None,
    tritonserver: str,
    orchestrator: bool,
    probes: Probes = Probes(),
) -> tuple[list[str], dict[str, str], EngineShape]:
    """Check the machine, render the repository and lay out the backends; the
    command to run. Raises EnvironmentMissing with a one-line reason."""
    settings = settings.replace(**{"server.llm_model_name": "tensorrt_llm"})
    engine_dir = Path(engine_dir) if engine_dir else default_engine_dir(settings.engine.model_dir)
    shape = engine_shape(engine_dir)
    mpirun = check_machine(shape, tritonserver, orchestrator, probes)
    work = options.work_dir
    repository = render_repository(
        settings, work / "model_repository", source=options.repository_source, trtllm_engine_dir=engine_dir
    )
    # the project's Python stub (this interpreter's) and TensorRT-LLM's backend side by side
    backends = prepare_backends(find_triton(), work / "backends")
    (backends / "tensorrtllm").symlink_to(CONTAINER_BACKEND_DIR, target_is_directory=True)
    server = TritonServer(dataclasses.replace(options, settings=settings))
    write_admin_key(server.admin_key_path, server.admin_key)
    command, env = launch_command(
        tritonserver,
        shape,
        repository,
        backends,
        variant_models(settings),
        _serving_flags(server),
        orchestrator,
        mpirun,
    )
    return command, env, shape


def run(command: list[str], extra_env: dict[str, str]) -> int:
    """Run in the foreground (Ctrl-C reaches every rank); the exit code."""
    env = os.environ.copy()
    env.update(extra_env)
    # the Python stub finds the venv's packages through the first python on PATH
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    apply_openmp_defaults(env)
    libs = str(find_triton().libraries)
    env["LD_LIBRARY_PATH"] = libs + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return subprocess.call(command, env=env)


__all__ = [
    "CONTAINER_TRITONSERVER",
    "EngineShape",
    "check_machine",
    "engine_shape",
    "launch_command",
    "prepare",
    "rank_args",
    "run",
]
