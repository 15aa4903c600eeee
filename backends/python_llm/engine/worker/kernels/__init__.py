"""The engine's native CPU kernels, plain C ABI, loaded with ctypes:
paged decode attention (`paged_decode_attention.cpp`), causal attention of a
prefill chunk over the paged cache (`paged_prefill_attention.cpp`), the greedy argmax
over logit rows (`argmax_rows.cpp`), the LM head fused with that argmax
for all-greedy steps (`lm_head_argmax.cpp`), the exact argmax from bf16
logits (`verified_argmax.cpp`; their bindings are `greedy.py`'s) and the decoder layer's
elementwise steps, fp32 (`layer_elementwise.cpp`: RMSNorm, rotary + K/V
cache write, SiLU x up), and fp32 projections on AMX tiles (`amx_gemm.cpp`)
or AVX2 / FMA lanes (`fma_gemm.cpp`).

They are compiled on first use with the system C++ compiler (about 3 s) for the
CPU it runs on (-march=native) and cached under `LLM_CACHE_DIR/kernels`; the
file name carries a digest of the source, the flags and the CPU's feature
flags, so an edited source or another CPU never picks up a stale binary
(`library.py`).
Without a compiler, or when the build fails, `cpu_kernels()` returns None
(logged once) and the engine uses its PyTorch paths.
`python -m python_llm.engine.worker.kernels` builds it ahead of time and checks it.
"""

from __future__ import annotations

import ctypes
import logging
import subprocess
import threading
from pathlib import Path

import torch

from ....cache import CACHE_DIR
from ..huge_pages import empty_on_huge_pages
from .greedy import GreedyKernels
from .library import KernelBuildError, build, library_path

log = logging.getLogger(__name__)

DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}

_lock = threading.Lock()
_loaded: dict[str, CpuKernels | None] = {}


class CpuKernels(GreedyKernels):
    """ctypes binding of the compiled library, with the checks the C side
    leaves to its caller."""

    def __init__(self, path: Path) -> None:
        # torch first: the library links libgomp.so.1, which must resolve to
        # the OpenMP runtime torch already loaded (one thread pool, not two)
        self._lib = ctypes.CDLL(str(path))
        super().__init__(self._lib)
        fn = self._lib.paged_decode_attention
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        fn.argtypes = [
            ctypes.c_int,
            ptr,
            i64,
            ptr,
            i64,
            ptr,
            ptr,
            ptr,
            i64,
            ptr,
            ptr,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            ctypes.c_float,
            ctypes.c_int,
        ]
        fn.restype = ctypes.c_int
        self._fn = fn
        prefill = self._lib.paged_prefill_attention
        prefill.argtypes = [
            ctypes.c_int,
            ptr,
            i64,
            ptr,
            i64,
            ptr,
            ptr,
            ptr,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            i64,
            ctypes.c_float,
            ctypes.c_int,
        ]
        prefill.restype = ctypes.c_int
        self._prefill = prefill
        self._rms_norm = self._lib.rms_norm_f32
        self._rms_norm.argtypes = [ptr, i64, ptr, ctypes.c_float, ptr, i64, i64, i64, ctypes.c_int]
        self._rms_norm.restype = None
        self._rotary = self._lib.rotary_cache_write_f32
        self._rotary.argtypes = [ptr, i64, ptr, ptr, ptr, i64, ptr, ptr, ptr, i64, i64, i64, i64, i64, ctypes.c_int]
        self._rotary.restype = ctypes.c_int
        self._silu_mul = self._lib.silu_mul_f32
        self._silu_mul.argtypes = [ptr, i64, ptr, i64, i64, i64, ctypes.c_int]
        self._silu_mul.restype = None
        self._amx_supported = self._lib.amx_gemm_supported
        self._amx_supported.restype = ctypes.c_int
        self._amx_elements = self._lib.amx_gemm_packed_elements
        self._amx_elements.argtypes = [i64, i64]
        self._amx_elements.restype = i64
        self._amx_pack = self._lib.amx_gemm_pack_weight
        self._amx_pack.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_int]
        self._amx_pack.restype = None
        self._amx_gemm = self._lib.amx_gemm_f32
        self._amx_gemm.argtypes = [ptr, i64, i64, ptr, i64, i64, ptr, ptr, i64, ptr, i64, ctypes.c_int]
        self._amx_gemm.restype = ctypes.c_int
        self._fma_supported = self._lib.fma_gemm_supported
        self._fma_supported.restype = ctypes.c_int
        self._fma_vector_floats = self._lib.fma_gemm_vector_floats
        self._fma_vector_floats.restype = ctypes.c_int
        self._fma_elements = self._lib.fma_gemm_packed_elements
        self._fma_elements.argtypes = [i64, i64]
        self._fma_elements.restype = i64
        self._fma_pack = self._lib.fma_gemm_pack_weight
        self._fma_pack.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_int]
        self._fma_pack.restype = None
        self._fma_gemm = self._lib.fma_gemm_f32
        self._fma_gemm.argtypes = [ptr, i64, i64, ptr, i64, i64, ptr, ptr, i64, ptr, i64, ctypes.c_int]
        self._fma_gemm.restype = ctypes.c_int
        supported = self._lib.paged_prefill_attention_supported
        supported.argtypes = [i64]
        supported.restype = ctypes.c_int
        self._prefill_supported = supported

    def prefill_attention_supported(self, head_dim: int) -> bool:
        """Whether `paged_prefill_attention` runs for this head_dim here (AVX2 + FMA, head_dim 64 or 128)."""
        return bool(self._prefill_supported(head_dim))

    def paged_prefill_attention(
        self,
        out: torch.Tensor,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        start: int,
        scale: float,
        check: bool = True,
    ) -> torch.Tensor:
        """out [N, H*D] = causal attention of a chunk's queries [N, H, D]:
        token i (position start + i) over cached positions 0 .. start + i,
        found through block_table (int32, the blocks covering start + N
        positions) in caches [kv_heads, blocks, block_size, D] that already
        hold the chunk's own K/V. `check=False` skips the argument checks
        (the layers after the first of a step)."""
        tokens, heads, head_dim = query.shape
        kv_heads, num_blocks, block_size, _ = key_cache.shape
        if check:
            self._check_prefill_arguments(out, query, key_cache, value_cache, block_table, start)
        status = self._prefill(
            DTYPE_CODES[query.dtype],
            out.data_ptr(),
            out.stride(0),
            query.data_ptr(),
            query.stride(0),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            block_table.data_ptr(),
            tokens,
            start,
            heads,
            kv_heads,
            head_dim,
            num_blocks,
            block_size,
            float(scale),
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"paged_prefill_attention failed with status {status}")
        return out

    def _check_prefill_arguments(
        self,
        out: torch.Tensor,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_table: torch.Tensor,
        start: int,
    ) -> None:
        tokens, heads, head_dim = query.shape
        kv_heads, num_blocks, block_size, cache_dim = key_cache.shape
        checks = [
            (query.stride(2) == 1 and query.stride(1) == head_dim, "query: heads and dims must be contiguous"),
            (
                key_cache.is_contiguous() and value_cache.is_contiguous() and key_cache.shape == value_cache.shape,
                "caches: contiguous and of one shape",
            ),
            (cache_dim == head_dim and heads % kv_heads == 0, "query heads / head_dim do not fit the cache"),
            (self.prefill_attention_supported(head_dim), f"head_dim {head_dim} not supported here"),
            (
                block_table.dtype == torch.int32
                and block_table.is_contiguous()
                and block_table.dim() == 1
                and block_table.numel() * block_size >= start + tokens,
                "block_table: int32 blocks covering the chunk",
            ),
            (start >= 0 and tokens > 0, "start >= 0 and a non-empty chunk"),
            (out.shape == (tokens, heads * head_dim) and out.stride(1) == 1, "out: [tokens, heads*head_dim]"),
            (query.dtype == key_cache.dtype == out.dtype and query.dtype in DTYPE_CODES, "one supported dtype"),
            (all(t.device.type == "cpu" for t in (out, query, key_cache, block_table)), "CPU tensors"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"paged_prefill_attention: {message}")
        if int(block_table.min()) < 0 or int(block_table.max()) >= num_blocks:
            raise ValueError("paged_prefill_attention: block ids outside the cache")

    # -- the decoder layer's elementwise steps (fp32 CPU tensors) -------------
    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * x / sqrt(mean(x^2) + eps) per row of x [rows, dim] (fp32, CPU)."""
        rows, dim = x.shape
        if (
            x.stride(1) != 1
            or weight.shape != (dim,)
            or not weight.is_contiguous()
            or x.dtype != torch.float32
            or x.is_cuda
            or weight.dtype != torch.float32
        ):
            raise ValueError("rms_norm: x [rows, dim] with contiguous rows and weight [dim] expected")
        out = x.new_empty(rows, dim)
        self._rms_norm(
            x.data_ptr(), x.stride(0), weight.data_ptr(), eps, out.data_ptr(), dim, rows, dim, torch.get_num_threads()
        )
        return out

    def rotary_cache_write(
        self,
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        check: bool = True,
    ) -> None:
        """Rotate the q and k heads of qkv [T, (heads + 2 kv_heads) * D] in
        place by positions [T] (int64; cos / sin tables [positions, D]), then
        store each token's k and v at its slot [T] (int64) of the caches
        [kv_heads, blocks, block_size, D]. Positions and slots are range-checked
        in C; `check=False` skips the layout checks (a step's layers after the
        first, whose tensors have the same layout)."""
        tokens = qkv.shape[0]
        _, num_blocks, block_size, head_dim = key_cache.shape
        if check:
            self._check_rotary_arguments(qkv, heads, kv_heads, positions, cos, sin, slots, key_cache, value_cache)
        status = self._rotary(
            qkv.data_ptr(),
            qkv.stride(0),
            positions.data_ptr(),
            cos.data_ptr(),
            sin.data_ptr(),
            cos.shape[0],
            slots.data_ptr(),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            num_blocks * block_size,
            tokens,
            heads,
            kv_heads,
            head_dim,
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError(f"rotary_cache_write: {'a position' if status == 1 else 'a slot'} out of range")

    @staticmethod
    def _check_rotary_arguments(
        qkv: torch.Tensor,
        heads: int,
        kv_heads: int,
        positions: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        slots: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
    ) -> None:
        tokens, width = qkv.shape
        cache_heads, _, _, head_dim = key_cache.shape
        checks = [
            (
                qkv.stride(1) == 1 and width == (heads + 2 * kv_heads) * head_dim and cache_heads == kv_heads,
                "qkv [T, (heads + 2 kv_heads) * head_dim] with contiguous rows",
            ),
            (
                key_cache.is_contiguous() and value_cache.is_contiguous() and key_cache.shape == value_cache.shape,
                "caches: contiguous and of one shape",
            ),
            (
                cos.is_contiguous() and sin.is_contiguous() and cos.shape == sin.shape and cos.shape[1] == head_dim,
                "cos / sin: contiguous [positions, head_dim]",
            ),
            (
                positions.dtype == slots.dtype == torch.int64
                and positions.is_contiguous()
                and slots.is_contiguous()
                and positions.shape == slots.shape == (tokens,),
                "positions / slots: contiguous int64 [T]",
            ),
            (
                all(
                    t.dtype == torch.float32 and t.device.type == "cpu" for t in (qkv, cos, sin, key_cache, value_cache)
                ),
                "fp32 CPU tensors",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"rotary_cache_write: {message}")

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up for gate_up [rows, 2 * inter] = [gate | up] (fp32, CPU)."""
        rows, width = gate_up.shape
        if gate_up.stride(1) != 1 or width % 2 or gate_up.dtype != torch.float32 or gate_up.is_cuda:
            raise ValueError("silu_mul: gate_up [rows, 2 * inter] with contiguous rows expected")
        inter = width // 2
        out = gate_up.new_empty(rows, inter)
        self._silu_mul(
            gate_up.data_ptr(), gate_up.stride(0), out.data_ptr(), inter, rows, inter, torch.get_num_threads()
        )
        return out

    # -- fp32 projections on AMX tiles (amx_gemm.cpp) -------------------------
    def amx_gemm_supported(self) -> bool:
        """Whether this CPU, this build and the OS let the AMX GEMM run."""
        return bool(self._amx_supported())

    def amx_pack_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """weight [n, k] (fp32, CPU, contiguous rows) split into its three
        bf16 parts in AMX's tile layout (int16 storage, 1.5x the fp32 bytes)."""
        if weight.dim() != 2 or weight.dtype != torch.float32 or weight.stride(1) != 1 or weight.is_cuda:
            raise ValueError("amx_pack_weight: an fp32 CPU weight [n, k] with contiguous rows expected")
        n, k = weight.shape
        packed = empty_on_huge_pages(self._amx_elements(n, k), torch.int16)
        self._amx_pack(weight.data_ptr(), weight.stride(0), n, k, packed.data_ptr(), torch.get_num_threads())
        return packed

    def amx_linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        n: int,
        k: int,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [m, k] @ weight.T (+ bias) (+ residual [m, n]) with the weight
        from amx_pack_weight; fp32 CPU tensors with contiguous rows (the
        projection checks them once, at load: these are its own tensors)."""
        m = x.shape[0]
        if x.stride(1) != 1 or x.shape[1] != k or (residual is not None and residual.shape != (m, n)):
            raise ValueError(f"amx_linear: x [m, {k}] with contiguous rows (and residual [m, {n}]) expected")
        out = x.new_empty(m, n)
        status = self._amx_gemm(
            x.data_ptr(),
            x.stride(0),
            m,
            packed.data_ptr(),
            n,
            k,
            None if bias is None else bias.data_ptr(),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0),
            out.data_ptr(),
            n,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError("amx_linear: AMX is not available in this process")
        return out

    # -- fp32 projections on AVX2 / FMA lanes (fma_gemm.cpp) -----------------
    def fma_gemm_supported(self) -> bool:
        """Whether this build targets AVX2 + FMA."""
        return bool(self._fma_supported())

    def fma_vector_floats(self) -> int:
        """Floats in one of the FMA GEMM's vector registers: 8 (ymm, AVX2) or 16 (zmm, AVX-512); 0 without it."""
        return int(self._fma_vector_floats())

    def fma_pack_weight(self, weight: torch.Tensor) -> torch.Tensor:
        """weight [n, k] (fp32, CPU, contiguous rows) in panels of two
        registers' columns (fma_gemm.cpp's layout; n rounded up to them)."""
        if weight.dim() != 2 or weight.dtype != torch.float32 or weight.stride(1) != 1 or weight.is_cuda:
            raise ValueError("fma_pack_weight: an fp32 CPU weight [n, k] with contiguous rows expected")
        n, k = weight.shape
        packed = empty_on_huge_pages(self._fma_elements(n, k), torch.float32)
        if packed.data_ptr() % 64:  # the kernel's aligned loads; torch's CPU allocator gives 64
            raise RuntimeError("fma_pack_weight: the packed weight is not 64-byte aligned")
        self._fma_pack(weight.data_ptr(), weight.stride(0), n, k, packed.data_ptr(), torch.get_num_threads())
        return packed

    def fma_linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        n: int,
        k: int,
        bias: torch.Tensor | None,
        residual: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """x [m, k] @ weight.T (+ bias) (+ residual [m, n]) with the weight
        from fma_pack_weight; fp32 CPU tensors with contiguous rows (the
        projection checks its own tensors once, at load)."""
        m = x.shape[0]
        if (
            x.stride(1) != 1
            or x.shape[1] != k
            or (residual is not None and (residual.shape != (m, n) or residual.stride(1) != 1))
        ):
            raise ValueError(f"fma_linear: x [m, {k}] with contiguous rows (and residual [m, {n}]) expected")
        out = x.new_empty(m, n)
        status = self._fma_gemm(
            x.data_ptr(),
            x.stride(0),
            m,
            packed.data_ptr(),
            n,
            k,
            None if bias is None else bias.data_ptr(),
            None if residual is None else residual.data_ptr(),
            0 if residual is None else residual.stride(0),
            out.data_ptr(),
            n,
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError("fma_linear: this build has no AVX2 / FMA")
        return out

    def paged_decode_attention(
        self,
        out: torch.Tensor,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        scale: float,
        check: bool = True,
        table_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """out [S, H*D] = attention of query [S, H, D] over each sequence's
        first context_lens[s] (int64) cached tokens, found through its row of
        block_tables [R, W] (int32) in caches [kv_heads, blocks, block_size, D].
        Sequence s uses row table_rows[s] (int64), or row s when table_rows is
        None (then R == S). `check=False` skips the argument checks: for the
        layers after the first of a step, whose arguments are the same."""
        seqs, heads, head_dim = query.shape
        kv_heads, num_blocks, block_size, _ = key_cache.shape
        if check:
            self._check_decode_arguments(out, query, key_cache, value_cache, block_tables, context_lens, table_rows)
        status = self._fn(
            DTYPE_CODES[query.dtype],
            out.data_ptr(),
            out.stride(0),
            query.data_ptr(),
            query.stride(0),
            key_cache.data_ptr(),
            value_cache.data_ptr(),
            block_tables.data_ptr(),
            block_tables.shape[1],
            None if table_rows is None else table_rows.data_ptr(),
            context_lens.data_ptr(),
            seqs,
            heads,
            kv_heads,
            head_dim,
            num_blocks,
            block_size,
            float(scale),
            torch.get_num_threads(),
        )
        if status != 0:
            raise RuntimeError(f"paged_decode_attention failed with status {status}")
        return out

    @staticmethod
    def _check_decode_arguments(
        out: torch.Tensor,
        query: torch.Tensor,
        key_cache: torch.Tensor,
        value_cache: torch.Tensor,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        table_rows: torch.Tensor | None,
    ) -> None:
        """What the C side trusts its caller with (a wrong shape there is
        memory corruption, not an exception)."""
        seqs, heads, head_dim = query.shape
        kv_heads, num_blocks, block_size, cache_dim = key_cache.shape
        rows = block_tables.shape[0] if block_tables.dim() == 2 else -1
        checks = [
            (query.stride(2) == 1 and query.stride(1) == head_dim, "query: heads and dims must be contiguous"),
            (
                key_cache.is_contiguous() and value_cache.is_contiguous() and key_cache.shape == value_cache.shape,
                "caches: contiguous and of one shape",
            ),
            (cache_dim == head_dim and heads % kv_heads == 0, "query heads / head_dim do not fit the cache"),
            (
                block_tables.dtype == torch.int32
                and block_tables.is_contiguous()
                and rows >= 0
                and (table_rows is not None or rows == seqs),
                "block_tables: contiguous int32 [seqs or rows, width]",
            ),
            (
                table_rows is None
                or (table_rows.dtype == torch.int64 and table_rows.is_contiguous() and table_rows.shape == (seqs,)),
                "table_rows: contiguous int64 [seqs]",
            ),
            (
                context_lens.dtype == torch.int64 and context_lens.is_contiguous() and context_lens.shape == (seqs,),
                "context_lens: contiguous int64 [seqs]",
            ),
            (out.shape == (seqs, heads * head_dim) and out.stride(1) == 1, "out: [seqs, heads*head_dim]"),
            (query.dtype == key_cache.dtype == out.dtype and query.dtype in DTYPE_CODES, "one supported dtype"),
            (all(t.device.type == "cpu" for t in (out, query, key_cache, block_tables, context_lens)), "CPU tensors"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(f"paged_decode_attention: {message}")
        if seqs and (
            int(context_lens.min()) < 1
            or int(context_lens.max()) > block_tables.shape[1] * block_size
            or int(block_tables.min()) < 0
            or int(block_tables.max()) >= num_blocks
        ):
            raise ValueError("paged_decode_attention: context_lens / block ids outside the cache")
        if seqs and table_rows is not None and (int(table_rows.min()) < 0 or int(table_rows.max()) >= rows):
            raise ValueError("paged_decode_attention: table_rows outside block_tables")


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
                log.info("compiling the CPU kernels", extra={"target": str(path)})
                build(path)
            kernels = CpuKernels(path)
        except (OSError, KernelBuildError, subprocess.SubprocessError) as exc:
            log.warning(
                "CPU kernels unavailable; using the PyTorch attention and argmax paths",
                extra={"error": f"{type(exc).__name__}: {exc}"[:2000]},
            )
        _loaded[key] = kernels
        return kernels
