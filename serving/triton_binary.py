"""Finds the official tritonserver build shipped in the nvidia-pytriton wheel
and lays out the writable backend directory it needs."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from .paths import REPO_ROOT


class TritonSetupError(RuntimeError):
    """A piece the server needs is missing; the message names it."""


@dataclass(frozen=True)
class TritonInstall:
    root: Path  # .../site-packages/pytriton/tritonserver

    @property
    def binary(self) -> Path:
        return self.root / "bin" / "tritonserver"

    @property
    def python_backend(self) -> Path:
        return self.root / "backends" / "python"

    @property
    def libraries(self) -> Path:
        # the wheel's bundled shared libraries; the binaries find them by a
        # relative RPATH, which a copied stub no longer resolves
        return self.root.parent.parent / "nvidia_pytriton.libs"

    def stub_for(self, version: tuple[int, int]) -> Path:
        return self.root / "python_backend_stubs" / f"{version[0]}.{version[1]}" / "triton_python_backend_stub"


def find_triton() -> TritonInstall:
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        raise TritonSetupError(
            "package nvidia-pytriton is not installed (it ships the tritonserver binary): run `make venv`"
        )
    install = TritonInstall(Path(list(spec.submodule_search_locations)[0]) / "tritonserver")
    for needed in (install.binary, install.python_backend / "libtriton_python.so"):
        if not needed.exists():
            raise TritonSetupError(f"{needed} is missing from the nvidia-pytriton wheel")
    return install


def prepare_backends(install: TritonInstall, target: Path) -> Path:
    """Build a writable backend directory: Triton's python backend with the stub
    for this interpreter, plus the project's Python-based backend `python_llm`.

    Rebuilt on every start so an edited backends/python_llm/model.py is served.
    """
    stub = install.stub_for(sys.version_info[:2])
    if not stub.is_file():
        raise TritonSetupError(
            f"no Triton Python stub for Python {sys.version_info[0]}.{sys.version_info[1]} at {stub}"
        )
    shutil.rmtree(target, ignore_errors=True)
    python_dir = target / "python"
    shutil.copytree(install.python_backend, python_dir, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(stub, python_dir / "triton_python_backend_stub")
    (python_dir / "triton_python_backend_stub").chmod(0o755)
    llm_dir = target / "python_llm"
    llm_dir.mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "backends" / "python_llm" / "model.py", llm_dir / "model.py")
    return target
