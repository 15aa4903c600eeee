"""What the tensorrt_llm variant needs from the machine, found or refused in
one line: a Python with TensorRT-LLM (at the pinned version), `trtllm-build`,
NVIDIA GPUs (as many as TP x PP), Triton with TensorRT-LLM's backend, mpirun.
Every probe is injectable so the refusals are tested on any machine."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .versions import CONTAINER_BACKEND_DIR, CONTAINER_TRITONSERVER, TENSORRT_LLM_VERSION, TRITON_CONTAINER


class EnvironmentMissing(RuntimeError):
    """Something the command needs is not on this machine; the message is one line."""


_VERSION_PROBE = "import importlib.metadata as m; print(m.version('tensorrt_llm'))"
Runner = Callable[..., subprocess.CompletedProcess]


@dataclass(frozen=True)
class Probes:
    which: Callable[[str], str | None] = shutil.which
    run: Runner = subprocess.run
    exists: Callable[[str], bool] = lambda path: Path(path).exists()


def gpu_count(probes: Probes = Probes()) -> int:
    """GPUs `nvidia-smi -L` lists; 0 without nvidia-smi or when it fails."""
    smi = probes.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        done = probes.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return 0
    if done.returncode != 0:
        return 0
    return sum(1 for line in done.stdout.splitlines() if line.startswith("GPU "))


def python_candidates(explicit: str | None, probes: Probes = Probes()) -> list[str]:
    if explicit:
        return [explicit]
    found = [sys.executable, probes.which("python3"), "/usr/bin/python3"]
    return list(dict.fromkeys(p for p in found if p and probes.exists(p)))


def find_tensorrt_llm(candidates: Sequence[str], probes: Probes = Probes()) -> tuple[str, str]:
    """(the Python that has tensorrt_llm, its version)."""
    for python in candidates:
        try:
            done = probes.run([python, "-c", _VERSION_PROBE], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError):
            continue
        if done.returncode == 0 and done.stdout.strip():
            return python, done.stdout.strip().splitlines()[-1]
    raise EnvironmentMissing(
        f"TensorRT-LLM is not installed here (no Python with the tensorrt_llm package among "
        f"{', '.join(candidates) or 'none'}); this repository is pinned to tensorrt-llm {TENSORRT_LLM_VERSION}, "
        f"as in {TRITON_CONTAINER}: run the command there"
    )


def check_version(version: str) -> None:
    if version.split("+")[0] != TENSORRT_LLM_VERSION:
        raise EnvironmentMissing(
            f"TensorRT-LLM {version} found, this repository is pinned to {TENSORRT_LLM_VERSION} (the parameter "
            f"names of its Triton backend, tensorrtllm_backend v{TENSORRT_LLM_VERSION}); use {TRITON_CONTAINER}"
        )


def find_trtllm_build(python: str, probes: Probes = Probes()) -> str:
    """`trtllm-build` next to that Python, else on PATH."""
    beside = str(Path(python).parent / "trtllm-build")
    if probes.exists(beside):
        return beside
    found = probes.which("trtllm-build")
    if found is None:
        raise EnvironmentMissing(f"trtllm-build is not on PATH nor next to {python} (TensorRT-LLM's CLI)")
    return found


def require_gpus(world_size: int, tp: int, pp: int, probes: Probes = Probes()) -> int:
    count = gpu_count(probes)
    if count == 0:
        raise EnvironmentMissing(
            "no NVIDIA GPU here (nvidia-smi lists none); TensorRT-LLM builds and runs its "
            "engine on the GPUs it serves from"
        )
    if count < world_size:
        raise EnvironmentMissing(f"tp {tp} x pp {pp} needs {world_size} GPUs, nvidia-smi lists {count}")
    return count


def require_triton_backend(tritonserver: str, probes: Probes = Probes()) -> None:
    if not probes.exists(tritonserver):
        raise EnvironmentMissing(
            f"no tritonserver at {tritonserver}; the tensorrt_llm variant runs in "
            f"{TRITON_CONTAINER} (its /opt/tritonserver)"
        )
    if not probes.exists(CONTAINER_BACKEND_DIR):
        raise EnvironmentMissing(
            f"TensorRT-LLM's Triton backend is not here ({CONTAINER_BACKEND_DIR} missing); run in {TRITON_CONTAINER}"
        )


def require_mpirun(probes: Probes = Probes()) -> str:
    found = probes.which("mpirun")
    if found is None:
        raise EnvironmentMissing(
            "mpirun is not on PATH: a TP x PP > 1 engine runs one tritonserver per rank "
            "under MPI (or pass --orchestrator)"
        )
    return found


__all__ = [
    "CONTAINER_TRITONSERVER",
    "EnvironmentMissing",
    "Probes",
    "check_version",
    "find_tensorrt_llm",
    "find_trtllm_build",
    "gpu_count",
    "python_candidates",
    "require_gpus",
    "require_mpirun",
    "require_triton_backend",
]
