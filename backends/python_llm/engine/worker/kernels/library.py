"""Where the native kernels' library comes from: its sources and flags, its
file name (a digest of both and of the CPU's feature flags, so that an edited
source or another CPU never loads a stale binary) and the compile."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

from ....cache import CACHE_DIR

SOURCES = [
    Path(__file__).with_name(name)
    for name in (
        "paged_decode_attention.cpp",
        "paged_prefill_attention.cpp",
        "argmax_rows.cpp",
        "lm_head_argmax.cpp",
        "layer_elementwise.cpp",
        "amx_gemm.cpp",
        "fma_gemm.cpp",
        "verified_argmax.cpp",
        "int16_lm_head.cpp",
    )
]
HEADERS = [
    Path(__file__).with_name(name)
    for name in (
        "cache_elements.h",
        "fast_exp.h",
        "verified_candidates.h",
        "paged_decode_attention_zmm.h",
        "paged_prefill_attention_tiles.h",
    )
]
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=gnu++20", "-shared", "-fPIC"]


class KernelBuildError(RuntimeError):
    pass


def cpu_features() -> str:
    text = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return text + line  # one core's line describes them all
    except OSError:
        pass
    return text


def library_path(cache_dir: Path = CACHE_DIR) -> Path:
    digest = hashlib.sha256(
        b"".join(s.read_bytes() for s in SOURCES + HEADERS) + " ".join(FLAGS).encode() + cpu_features().encode()
    )
    return cache_dir / "kernels" / f"python_llm_cpu_kernels-{digest.hexdigest()[:16]}.so"


def build(target: Path, sources: list[Path] = SOURCES) -> Path:
    """Compile the kernel into `target` (atomically: concurrent builders,
    e.g. several Triton model instances starting at once, do not collide);
    `sources`: another revision's, for a benchmark's A/B."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelBuildError("no C++ compiler (g++ / c++ / $CXX) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=target.stem, suffix=".so.partial", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *FLAGS, "-o", partial, *map(str, sources)], capture_output=True, text=True, timeout=300
        )
        if result.returncode != 0:
            raise KernelBuildError(f"{compiler} exited {result.returncode}: {result.stderr[-2000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target
