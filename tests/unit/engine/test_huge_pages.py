"""Huge pages under the KV cache and the packed weights: asked for where the
OS offers them, and nothing else about the buffers changes."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from python_llm.engine.worker.huge_pages import HUGE_PAGE_BYTES, advise_huge_pages, empty_on_huge_pages
from python_llm.engine.worker.kv_cache import KVCacheShape, PagedKVCache

THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _thp_mode() -> str | None:
    """The kernel's THP mode ("always", "madvise", "never"), None where unknown
    or where this process may not use huge pages (prctl, THP_enabled: 0)."""
    try:
        found = re.search(r"\[(\w+)\]", THP_SETTING.read_text())
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    if re.search(r"^THP_enabled:\s*0", status, re.MULTILINE):
        return None
    return found.group(1) if found else None


def _mappings_of(tensor: torch.Tensor) -> list[tuple[int, int, set[str], int]]:
    """(start, end, VmFlags, KiB of anonymous huge pages) of each mapping
    that holds some of `tensor`'s bytes."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    found: list[tuple[int, int, set[str], int]] = []
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            low, high = int(head.group(1), 16), int(head.group(2), 16)
            inside = low < end and start < high
            if inside:
                found.append((low, high, set(), 0))
        elif inside and line.startswith("AnonHugePages:"):
            low, high, flags, _ = found[-1]
            found[-1] = (low, high, flags, int(line.split()[1]))
        elif inside and line.startswith("VmFlags:"):
            found[-1][2].update(line.split()[1:])
    return found


def test_a_buffer_too_small_for_one_huge_page_is_left_alone() -> None:
    assert advise_huge_pages(torch.empty(HUGE_PAGE_BYTES // 8, dtype=torch.float32)) is False


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or _thp_mode() not in ("madvise", "always"),
    reason="this kernel offers no transparent huge pages",
)
def test_a_big_buffer_is_advised_for_huge_pages() -> None:
    """Every whole huge page of the buffer lies in a mapping advised for
    huge pages (VmFlags `hg`, MADV_HUGEPAGE). Whether the kernel has huge
    pages to give when the buffer is first written is the machine's state,
    not the engine's: under fragmentation it gave none once (a run of the
    engine's tests beside a benchmark), so it is reported, not asserted."""
    tensor = empty_on_huge_pages((16 * HUGE_PAGE_BYTES) // 4, torch.float32)
    tensor.fill_(1.0)
    start = -(-tensor.data_ptr() // HUGE_PAGE_BYTES) * HUGE_PAGE_BYTES
    end = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // HUGE_PAGE_BYTES * HUGE_PAGE_BYTES
    mappings = _mappings_of(tensor)
    advised = sum(
        min(high, end) - max(low, start)
        for low, high, flags, _ in mappings
        if "hg" in flags and low < end and start < high
    )
    huge_kib = sum(kib for *_, kib in mappings)
    assert end - start >= 15 * HUGE_PAGE_BYTES
    assert advised == end - start, (
        f"{advised} of {end - start} bytes advised ({huge_kib} KiB of huge pages given): {mappings}"
    )


def test_the_kv_cache_starts_as_zeros_on_the_cpu() -> None:
    shape = KVCacheShape(num_layers=2, num_blocks=300, block_size=16, num_kv_heads=3, head_dim=64)
    cache = PagedKVCache(shape, torch.float32, "cpu")
    for tensor in cache.keys + cache.values:
        assert tensor.shape == (3, 300, 16, 64)
        assert tensor.dtype == torch.float32
        assert not tensor.any()
