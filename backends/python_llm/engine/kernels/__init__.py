"""The engine's native CPU kernel: paged decode attention
(`paged_decode_attention.cpp`, plain C ABI, loaded with ctypes).

It is compiled on first use with the system C++ compiler (about 3 s) for the
CPU it runs on (-march=native) and cached under `LLM_CACHE_DIR/kernels`; the
file name carries a digest of the source, the flags and the CPU's feature
flags, so an edited source or another CPU never picks up a stale binary.
Without a compiler, or when the build fails, `cpu_kernels()` returns None
(logged once) and the engine uses its PyTorch attention path.
`python -m python_llm.engine.kernels` builds it ahead of time and checks it.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from ...cache import CACHE_DIR

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("paged_decode_attention.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp", "-std=gnu++20", "-shared", "-fPIC"]
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

_lock = threading.Lock()
_loaded: dict[str, "CpuKernels | None"] = {}


class KernelBuildError(RuntimeError):
    pass


def _cpu_features() -> str:
    text = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return text + line   # one core's line describes them all
    except OSError:
        pass
    return text


def library_path(cache_dir: Path = CACHE_DIR) -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(FLAGS).encode() + _cpu_features().encode())
    return cache_dir / "kernels" / f"paged_decode_attention-{digest.hexdigest()[:16]}.so"


def build(target: Path) -> Path:
    """Compile the kernel into `target` (atomically: concurrent builders,
    e.g. several Triton model instances starting at once, do not collide)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        raise KernelBuildError("no C++ compiler (g++ / c++ / $CXX) on PATH")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(prefix=target.stem, suffix=".so.partial", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run([compiler, *FLAGS, "-o", partial, str(SOURCE)],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise KernelBuildError(f"{compiler} exited {result.returncode}: {result.stderr[-2000:]}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return target


class CpuKernels:
    """ctypes binding of the compiled library, with the shape checks the C
    side leaves to its caller (a wrong shape there is memory corruption)."""

    def __init__(self, path: Path) -> None:
        # torch first: the library links libgomp.so.1, which must resolve to
        # the OpenMP runtime torch already loaded (one thread pool, not two)
        self.path = path
        self._lib = ctypes.CDLL(str(path))
        fn = self._lib.paged_decode_attention
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn.argtypes = [ctypes.c_int, ptr, i64, ptr, i64, ptr, ptr, ptr, i64, ptr, i64, i64, i64, i64, i64, i64,
                       ctypes.c_float, ctypes.c_int]
        fn.restype = ctypes.c_int
        self._fn = fn

    def paged_decode_attention(self, out: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor,
                               value_cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor,
                               scale: float) -> torch.Tensor:
        """out [S, H*D] = attention of query [S, H, D] over each sequence's
        first context_lens[s] cached tokens, found through block_tables [S, W]
        (int32) in caches [kv_heads, blocks, block_size, D]."""
        seqs, heads, head_dim = query.shape
        kv_heads, num_blocks, block_size, cache_dim = key_cache.shape
        checks = [
            (query.stride(2) == 1 and query.stride(1) == head_dim, "query: heads and dims must be contiguous"),
            (key_cache.is_contiguous() and value_cache.is_contiguous()
             and key_cache.shape == value_cache.shape, "caches: contiguous and of one shape"),
            (cache_dim == head_dim and heads % kv_heads == 0, "query heads / head_dim do not fit the cache"),
            (block_tables.dtype == torch.int32 and block_tables.is_contiguous()
             and block_tables.shape[0] == seqs, "block_tables: contiguous int32 [seqs, width]"),
            (context_lens.dtype == torch.int32 and context_lens.is_contiguous()
             and context_lens.shape == (seqs,), "context_lens: contiguous int32 [seqs]"),
            (out.shape == (seqs, heads * head_dim) and out.stride(1) == 1, "out: [seqs, heads*head_dim]"),
            (query.dtype == key_cache.dtype == out.dtype and query.dtype in DTYPE_CODES, "one supported dtype"),
            (all(t.device.type == "cpu" for t in (out, query, key_cache, block_tables, context_lens)), "CPU tensors"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"paged_decode_attention: {message}")
        status = self._fn(DTYPE_CODES[query.dtype], out.data_ptr(), out.stride(0), query.data_ptr(),
                          query.stride(0), key_cache.data_ptr(), value_cache.data_ptr(), block_tables.data_ptr(),
                          block_tables.shape[1], context_lens.data_ptr(), seqs, heads, kv_heads, head_dim,
                          num_blocks, block_size, float(scale), torch.get_num_threads())
        if status != 0:
            raise RuntimeError(f"paged_decode_attention failed with status {status}")
        return out


def cpu_kernels(cache_dir: Path = CACHE_DIR) -> CpuKernels | None:
    """The compiled kernels (built here on first use), or None when they
    cannot be built on this machine."""
    key = str(cache_dir)
    with _lock:
        if key in _loaded:
            return _loaded[key]
        kernels: CpuKernels | None = None
        try:
            path = library_path(cache_dir)
            if not path.exists():
                log.info("compiling the CPU attention kernel", extra={"target": str(path)})
                build(path)
            kernels = CpuKernels(path)
        except (OSError, KernelBuildError, subprocess.SubprocessError) as exc:
            log.warning("CPU attention kernel unavailable; using the PyTorch attention path",
                        extra={"error": f"{type(exc).__name__}: {exc}"[:2000]})
        _loaded[key] = kernels
        return kernels
