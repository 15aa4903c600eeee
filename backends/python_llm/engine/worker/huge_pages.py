"""Transparent huge pages for the engine's big, long-lived CPU buffers: the
paged KV cache and the packed projection weights.

A decode step reads its sequences' K/V blocks (16 tokens x one KV head, 4
KiB in fp32) wherever the block tables put them, so on 4 KiB pages nearly
every block costs a TLB miss and a page walk. On the 2-core AMX machine
reading 150 MiB of random 4 KiB blocks a thread ran at 12.6 GB/s on 4 KiB
pages and 17.3 GB/s on 2 MiB pages, and the offline engine 1.037x (docs/
benchmarks.md, "Kept: huge pages under the KV cache and the packed
weights").

Most Linux machines ship transparent huge pages as `madvise` (so also these
VMs): memory gets them only where asked, before it is first touched. So a
buffer is allocated empty, advised here, then written. Where the OS has no
huge pages, or says no, nothing changes but the page size.
"""

from __future__ import annotations

import ctypes
import mmap
import sys
from collections.abc import Callable

import torch

HUGE_PAGE_BYTES = 2 << 20


def _madvise() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"):
        return None
    libc = ctypes.CDLL(None, use_errno=True)
    fn = libc.madvise
    fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def advise_huge_pages(tensor: torch.Tensor) -> bool:
    """Ask for huge pages under the whole 2 MiB pages inside `tensor`'s bytes
    (a CPU tensor not yet written). True when the OS took the advice."""
    if _MADVISE is None or tensor.device.type != "cpu":
        return False
    start = tensor.data_ptr()
    end = start + tensor.numel() * tensor.element_size()
    first = -(-start // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    last = end // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    if last <= first:
        return False
    return _MADVISE(first, last - first, mmap.MADV_HUGEPAGE) == 0


def empty_on_huge_pages(size: int | tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.empty on the CPU, advised to huge pages before anything touches it."""
    tensor = torch.empty(size, dtype=dtype)
    advise_huge_pages(tensor)
    return tensor
