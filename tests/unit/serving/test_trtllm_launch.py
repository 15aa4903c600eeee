"""`python -m serving launch-trtllm`: the world size comes from the engine
(TP x PP), one tritonserver per rank under mpirun as TensorRT-LLM's
scripts/launch_triton_server.py (tensorrtllm_backend v0.14.0) starts them, or
one in orchestrator mode; without the container's Triton it says so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from serving.launcher import LaunchOptions
from serving.paths import REPO_ROOT
from serving.settings import DeploymentSettings
from serving.trtllm.engine_config import ENGINE_MODEL_NAME
from serving.trtllm.environment import EnvironmentMissing, Probes
from serving.trtllm.launch import EngineShape, engine_shape, launch_command, prepare
from serving.trtllm.versions import CONTAINER_BACKEND_DIR, CONTAINER_TRITONSERVER

VARIANT = ("preprocessing", "ensemble", "llm_bls", "postprocessing", "tensorrt_llm", ENGINE_MODEL_NAME)


def _engine(folder: Path, tp: int, pp: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(
            {
                "version": "0.14.0",
                "pretrained_config": {
                    "architecture": "LlamaForCausalLM",
                    "mapping": {"world_size": tp * pp, "tp_size": tp, "pp_size": pp},
                },
            }
        )
    )
    return folder


def _machine(gpus: int = 8, mpirun: bool = True) -> Probes:
    def which(name: str) -> str | None:
        return {"nvidia-smi": "/usr/bin/nvidia-smi", "mpirun": "/usr/bin/mpirun" if mpirun else None}.get(name)

    def run(command: list[str], **_: object) -> subprocess.CompletedProcess:
        return subprocess.CompletedProcess(command, 0, "".join(f"GPU {i}: H100\n" for i in range(gpus)), "")

    return Probes(which=which, run=run, exists=lambda path: path in (CONTAINER_TRITONSERVER, CONTAINER_BACKEND_DIR))


def _segments(command: list[str]) -> list[list[str]]:
    """mpirun's per-rank argument groups (split at ':')."""
    body = command[2:]
    groups, current = [], []
    for arg in body:
        if arg == ":":
            groups.append(current)
            current = []
        else:
            current.append(arg)
    return groups + [current]


def test_the_engines_tp_and_pp_give_the_world_size(tmp_path: Path):
    assert engine_shape(_engine(tmp_path / "e", 2, 2)) == EngineShape(2, 2)
    assert engine_shape(_engine(tmp_path / "one", 1, 1)).world_size == 1
    with pytest.raises(EnvironmentMissing, match="no TensorRT-LLM engine at .* build-trtllm"):
        engine_shape(tmp_path / "none")


def test_leader_mode_runs_one_tritonserver_per_rank(tmp_path: Path):
    command, env = launch_command(
        "/opt/tritonserver/bin/tritonserver",
        EngineShape(2, 2),
        tmp_path / "repo",
        tmp_path / "backends",
        VARIANT,
        ["--http-port=8000"],
        orchestrator=False,
        mpirun="/usr/bin/mpirun",
    )
    assert command[:2] == ["/usr/bin/mpirun", "--allow-run-as-root"] and env == {}
    ranks = _segments(command)
    assert len(ranks) == 4
    for rank, args in enumerate(ranks):
        assert args[:3] == ["-n", "1", "/opt/tritonserver/bin/tritonserver"]
        assert "--model-control-mode=explicit" in args and "--disable-auto-complete-config" in args
        assert f"--backend-config=python,shm-region-prefix-name=prefix{rank}_" in args
        loaded = [a.split("=", 1)[1] for a in args if a.startswith("--load-model=")]
        # rank 0 serves the variant (never python_llm); the others only run TensorRT-LLM's ranks
        assert loaded == (list(VARIANT) if rank == 0 else [ENGINE_MODEL_NAME])


def test_orchestrator_mode_and_a_single_rank_run_one_tritonserver(tmp_path: Path):
    command, env = launch_command("/t", EngineShape(4, 1), tmp_path, tmp_path, VARIANT, [], orchestrator=True)
    assert command[0] == "/t" and ":" not in command
    assert env == {"TRTLLM_ORCHESTRATOR": "1", "TRTLLM_ORCHESTRATOR_SPAWN_PROCESSES": "1"}
    single, env = launch_command("/t", EngineShape(1, 1), tmp_path, tmp_path, VARIANT, [], orchestrator=False)
    assert single[0] == "/t" and env == {}


def _prepare(tmp_path: Path, engine_dir: Path, probes: Probes, orchestrator: bool = False):
    settings = DeploymentSettings.load(environ={}, model_dir=str(tmp_path / "model"))
    options = LaunchOptions(
        settings=settings, http_port=18000, grpc_port=18001, metrics_port=18002, work_dir=tmp_path / "work"
    )
    return prepare(settings, options, engine_dir, CONTAINER_TRITONSERVER, orchestrator, probes)


def test_prepare_renders_the_variant_for_the_engine_and_checks_the_machine(tmp_path: Path):
    engine_dir = _engine(tmp_path / "engines" / "tp2pp2", 2, 2)
    command, env, shape = _prepare(tmp_path, engine_dir, _machine(gpus=4))
    assert shape == EngineShape(2, 2) and command[0] == "/usr/bin/mpirun"
    work = tmp_path / "work"
    repository = work / "model_repository"
    engine = text_format.Parse(
        (repository / ENGINE_MODEL_NAME / "config.pbtxt").read_text(), model_config_pb2.ModelConfig()
    )
    assert engine.parameters["gpt_model_path"].string_value == str(engine_dir)
    ensemble = (repository / "ensemble" / "config.pbtxt").read_text()
    assert 'model_name: "tensorrt_llm"' in ensemble  # switched although the settings said python_llm
    assert os.readlink(work / "backends" / "tensorrtllm") == CONTAINER_BACKEND_DIR
    assert (work / "backends" / "python" / "triton_python_backend_stub").is_file()
    rank0 = _segments(command)[0]
    assert "--http-port=18000" in rank0 and any(a.startswith("--http-restricted-api=") for a in rank0)
    key = (work / "admin_key").read_text().strip()
    assert any(a.endswith(f"triton-admin-key={key}") for a in rank0)
    assert oct((work / "admin_key").stat().st_mode & 0o777) == "0o600"


@pytest.mark.parametrize(
    ("probes", "expected"),
    [
        (Probes(which=lambda _: None, exists=lambda _: False), f"no tritonserver at {CONTAINER_TRITONSERVER}"),
        (
            Probes(which=lambda _: None, exists=lambda p: p == CONTAINER_TRITONSERVER),
            "TensorRT-LLM's Triton backend is not here",
        ),
        (_machine(mpirun=False), "mpirun is not on PATH"),
        (_machine(gpus=2), "tp 2 x pp 2 needs 4 GPUs, nvidia-smi lists 2"),
    ],
)
def test_each_missing_piece_is_named(tmp_path: Path, probes: Probes, expected: str):
    with pytest.raises(EnvironmentMissing) as caught:
        _prepare(tmp_path, _engine(tmp_path / "e", 2, 2), probes)
    assert expected in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.skipif(Path(CONTAINER_TRITONSERVER).exists(), reason="the container's Triton is here")
def test_outside_the_container_the_command_says_so_in_one_line():
    done = subprocess.run(
        [sys.executable, "-m", "serving", "launch-trtllm", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO_ROOT,
    )
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"launch-trtllm: no tritonserver at {CONTAINER_TRITONSERVER}")
