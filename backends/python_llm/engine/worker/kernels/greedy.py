"""Bindings of the greedy-sampling kernels: the argmax over fp32 logit rows
(`argmax_rows.cpp`), the LM head fused with that argmax (`lm_head_argmax.cpp`),
the exact argmax from bf16 logits and their error bound
(`verified_argmax.cpp`) and the int16 LM head with its exact argmax
(`int16_lm_head.cpp`). `CpuKernels` (this package) inherits them."""

from __future__ import annotations

import array
import ctypes
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Int16PackedHead:
    """An LM head quantized for `int16_lm_head_argmax`: the fp32 weight (the
    candidates' rows), its int16 copy in the kernel's tiles, and per padded
    row its scale and the two factors of the error bound."""

    weight: torch.Tensor
    packed: torch.Tensor
    scales: torch.Tensor
    p_factor: torch.Tensor
    q_factor: torch.Tensor


class GreedyKernels:
    def __init__(self, lib: ctypes.CDLL) -> None:
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        self._argmax = lib.argmax_rows_f32
        self._argmax.argtypes = [ptr, i64, i64, i64, ptr, ctypes.c_int]
        self._argmax.restype = None
        self._lm_head_argmax = lib.lm_head_argmax_f32
        self._lm_head_argmax.argtypes = [ptr, i64, i64, ptr, i64, i64, i64, ptr, ctypes.c_int]
        self._lm_head_argmax.restype = ctypes.c_int
        self._bf16_supported = lib.bf16_dot_supported
        self._bf16_supported.restype = ctypes.c_int
        self._verified_argmax = lib.verified_argmax_bf16
        self._verified_argmax.argtypes = [
            ptr,
            i64,
            i64,
            i64,
            ptr,
            i64,
            ptr,
            i64,
            ptr,
            i64,
            ctypes.c_float,
            ptr,
            ptr,
            ctypes.c_int,
        ]
        self._verified_argmax.restype = None
        self._int16_supported = lib.int16_lm_head_supported
        self._int16_supported.restype = ctypes.c_int
        self._int16_elements = lib.int16_lm_head_packed_elements
        self._int16_elements.argtypes = [i64, i64]
        self._int16_elements.restype = i64
        self._int16_padded_rows = lib.int16_lm_head_padded_rows
        self._int16_padded_rows.argtypes = [i64]
        self._int16_padded_rows.restype = i64
        self._int16_pack = lib.int16_lm_head_pack
        self._int16_pack.argtypes = [ptr, i64, i64, i64, ptr, ptr, ptr, ptr, ctypes.c_int]
        self._int16_pack.restype = ctypes.c_int
        self._int16_argmax = lib.int16_lm_head_argmax
        self._int16_argmax.argtypes = [
            ptr,
            i64,
            i64,
            ptr,
            ptr,
            ptr,
            ptr,
            ptr,
            i64,
            i64,
            i64,
            ptr,
            ptr,
            ptr,
            ctypes.c_int,
        ]
        self._int16_argmax.restype = ctypes.c_int

    def argmax_rows(self, logits: torch.Tensor) -> torch.Tensor:
        """logits.argmax(dim=-1) for fp32 [rows, vocab] on the CPU (same ties
        and NaN rule as torch)."""
        rows, vocab = logits.shape
        if logits.dtype != torch.float32 or logits.stride(1) != 1 or logits.device.type != "cpu":
            raise ValueError("argmax_rows: fp32 CPU logits with contiguous rows expected")
        if not 0 < vocab < 2**31:
            raise ValueError(f"argmax_rows: vocab must be in 1 .. 2^31-1, got {vocab}")
        out = torch.empty(rows, dtype=torch.int64)
        if rows:
            self._argmax(logits.data_ptr(), rows, vocab, logits.stride(0), out.data_ptr(), torch.get_num_threads())
        return out

    def lm_head_argmax(self, hidden: torch.Tensor, weight: torch.Tensor) -> list[int]:
        """(hidden @ weight.T).argmax(dim=-1).tolist() without the logits:
        hidden [rows, dim], weight [vocab, dim], both fp32 on the CPU with
        contiguous rows. Same ties and NaN rule as torch.argmax; a logit's
        last bits may differ from a GEMM's (another summation order). The ids
        land in an `array.array`, whose `tolist` is a fraction of a tensor's."""
        if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
            raise ValueError(
                f"lm_head_argmax: hidden [rows, dim] and weight [vocab, dim] expected, "
                f"got {tuple(hidden.shape)} and {tuple(weight.shape)}"
            )
        if any(t.dtype != torch.float32 or t.device.type != "cpu" or t.stride(1) != 1 for t in (hidden, weight)):
            raise ValueError("lm_head_argmax: fp32 CPU tensors with contiguous rows expected")
        rows, dim = hidden.shape
        out = array.array("q", bytes(8 * rows))
        status = self._lm_head_argmax(
            hidden.data_ptr(),
            rows,
            hidden.stride(0),
            weight.data_ptr(),
            weight.shape[0],
            weight.stride(0),
            dim,
            out.buffer_info()[0],
            torch.get_num_threads(),
        )
        if status != 0:
            raise ValueError(f"lm_head_argmax: arguments out of range (status {status})")
        return out.tolist()

    def bf16_dot_supported(self) -> bool:
        """Whether this build has bf16 dot products (AVX512-BF16 or AMX-BF16),
        where a bf16 LM head runs at twice fp32's speed or more."""
        return bool(self._bf16_supported())

    def verified_argmax(
        self, approx: torch.Tensor, hidden: torch.Tensor, weight: torch.Tensor, norms: torch.Tensor, bound: float
    ) -> tuple[list[int], list[int]]:
        """The exact argmax of hidden @ weight.T per row, from `approx` [rows,
        vocab] bf16 logits whose errors are within bound * ||hidden[r]|| *
        norms[v] (norms: weight's row norms, fp32). Returns (token ids, -1
        for a row that is not finite; candidates dotted again per row)."""
        rows, vocab = approx.shape
        dim = hidden.shape[1]
        if (
            approx.dtype != torch.bfloat16
            or hidden.dtype != torch.float32
            or weight.dtype != torch.float32
            or norms.dtype != torch.float32
        ):
            raise ValueError("verified_argmax: bf16 logits, fp32 hidden, weight and norms expected")
        if hidden.shape[0] != rows or weight.shape != (vocab, dim) or norms.shape != (vocab,):
            raise ValueError(
                f"verified_argmax: logits {tuple(approx.shape)}, hidden {tuple(hidden.shape)}, "
                f"weight {tuple(weight.shape)} and norms {tuple(norms.shape)} do not fit"
            )
        if any(t.device.type != "cpu" or t.stride(-1) != 1 for t in (approx, hidden, weight, norms)):
            raise ValueError("verified_argmax: CPU tensors with contiguous rows expected")
        out = array.array("q", bytes(8 * rows))
        candidates = array.array("q", bytes(8 * rows))
        if rows:
            self._verified_argmax(
                approx.data_ptr(),
                rows,
                vocab,
                approx.stride(0),
                hidden.data_ptr(),
                hidden.stride(0),
                weight.data_ptr(),
                weight.stride(0),
                norms.data_ptr(),
                dim,
                bound,
                out.buffer_info()[0],
                candidates.buffer_info()[0],
                torch.get_num_threads(),
            )
        return out.tolist(), candidates.tolist()

    def int16_lm_head_supported(self) -> bool:
        """Whether this build multiplies int16 on AVX2 lanes, where the int16
        LM head runs at ~1.6x the fp32 one's speed (Zen 3, 64 rows)."""
        return bool(self._int16_supported())

    def int16_pack_lm_head(self, weight: torch.Tensor) -> Int16PackedHead:
        """weight [vocab, dim] fp32 quantized for `int16_lm_head_argmax`."""
        if weight.dim() != 2 or weight.dtype != torch.float32 or weight.device.type != "cpu" or weight.stride(1) != 1:
            raise ValueError("int16_pack_lm_head: an fp32 CPU [vocab, dim] weight with contiguous rows expected")
        vocab, dim = weight.shape
        padded = self._int16_padded_rows(vocab)
        packed = torch.empty(self._int16_elements(vocab, dim), dtype=torch.int16)
        scales, p_factor, q_factor = (torch.empty(padded) for _ in range(3))
        if self._int16_pack(
            weight.data_ptr(),
            vocab,
            dim,
            weight.stride(0),
            packed.data_ptr(),
            scales.data_ptr(),
            p_factor.data_ptr(),
            q_factor.data_ptr(),
            torch.get_num_threads(),
        ):
            raise ValueError("int16_pack_lm_head: the LM head has non-finite weights")
        return Int16PackedHead(weight, packed, scales, p_factor, q_factor)

    def int16_lm_head_argmax(
        self, hidden: torch.Tensor, head: Int16PackedHead, scratch: torch.Tensor
    ) -> tuple[list[int], list[int]]:
        """The exact argmax of hidden @ head.weight.T per row (-1 for a row
        that is not finite), and how many candidates each row dotted again.
        scratch: fp32, at least [rows, padded vocab] (the approximate logits)."""
        rows, dim = hidden.shape
        vocab = head.weight.shape[0]
        if hidden.dtype != torch.float32 or hidden.device.type != "cpu" or hidden.stride(1) != 1:
            raise ValueError("int16_lm_head_argmax: fp32 CPU hidden rows, contiguous, expected")
        if dim != head.weight.shape[1]:
            raise ValueError(
                f"int16_lm_head_argmax: hidden {tuple(hidden.shape)} and weight {tuple(head.weight.shape)} do not fit"
            )
        if (
            scratch.dtype != torch.float32
            or not scratch.is_contiguous()
            or scratch.numel() < rows * head.scales.shape[0]
        ):
            raise ValueError("int16_lm_head_argmax: the scratch is too small")
        out = array.array("q", bytes(8 * rows))
        candidates = array.array("q", bytes(8 * rows))
        if self._int16_argmax(
            hidden.data_ptr(),
            rows,
            hidden.stride(0),
            head.packed.data_ptr(),
            head.scales.data_ptr(),
            head.p_factor.data_ptr(),
            head.q_factor.data_ptr(),
            head.weight.data_ptr(),
            head.weight.stride(0),
            vocab,
            dim,
            scratch.data_ptr(),
            out.buffer_info()[0],
            candidates.buffer_info()[0],
            torch.get_num_threads(),
        ):
            raise ValueError(f"int16_lm_head_argmax: arguments out of range (dim {dim})")
        return out.tolist(), candidates.tolist()
