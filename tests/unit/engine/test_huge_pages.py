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


def _huge_kib_of(tensor: torch.Tensor) -> int:
    """KiB of anonymous huge pages in the mappings that hold `tensor`'s bytes."""
    start, end = tensor.data_ptr(), tensor.data_ptr() + tensor.numel() * tensor.element_size()
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = re.match(r"^([0-9a-f]+)-([0-9a-f]+) ", line)
        if head:
            low, high = int(head.group(1), 16), int(head.group(2), 16)
            inside = low < end and start < high
        elif inside and line.startswith("AnonHugePages:"):
            total += int(line.split()[1])
    return total


def test_a_buffer_too_small_for_one_huge_page_is_left_alone() -> None:
    assert advise_huge_pages(torch.empty(HUGE_PAGE_BYTES // 8, dtype=torch.float32)) is False


@pytest.mark.skipif(not sys.platform.startswith("linux") or _thp_mode() not in ("madvise", "always"),
                    reason="this kernel offers no transparent huge pages")
def test_a_big_buffer_gets_huge_pages_once_written() -> None:
    tensor = empty_on_huge_pages((16 * HUGE_PAGE_BYTES) // 4, torch.float32)
    tensor.fill_(1.0)
    huge_kib = _huge_kib_of(tensor)
    # all but the partial pages at the two ends; the kernel may fall short
    # under fragmentation, so at least half is asked for
    assert huge_kib >= 8 * HUGE_PAGE_BYTES // 1024, f"{huge_kib} KiB of huge pages under a 32 MiB buffer"


def test_the_kv_cache_starts_as_zeros_on_the_cpu() -> None:
    shape = KVCacheShape(num_layers=2, num_blocks=300, block_size=16, num_kv_heads=3, head_dim=64)
    cache = PagedKVCache(shape, torch.float32, "cpu")
    for tensor in cache.keys + cache.values:
        assert tensor.shape == (3, 300, 16, 64)
        assert tensor.dtype == torch.float32
        assert not tensor.any()
