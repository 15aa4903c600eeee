"""Where new KV blocks go: right after the request's last block when that one
is free and empty, else in the middle of the longest run of free, empty
blocks ("empty": holding no cached block).

Why: the CPU decode attention streams each sequence's K and V block by block,
and memory reads a run of neighbouring blocks faster than scattered ones. On
the 2-core AMX Xeon, 64 sequences x 200 tokens, decode attention 25.6 ms a
step with each sequence's blocks in one run, 28.5 ms with them interleaved
(what taking the free list's head gives decodes that grow side by side), 33.4
ms shuffled (docs/benchmarks.md, "Blocks placed in runs"). The middle, not
the start, of the longest run: the request before the run grows into its
first half, the new one into the second.

Blocks that still hold a cached block are left to the free list's LRU order:
placing over them would evict prefix-cache hits out of that order (on a
multi-turn workload, a third to half of the hit tokens were lost that way).
So placement prefers empty blocks, and evicts nothing LRU would not have.
"""
from __future__ import annotations

import numpy as np


class BlockPlacement:
    """Per block id: free, and holding a cached block. The pool reports
    every change."""

    def __init__(self, num_blocks: int) -> None:
        self.free = np.ones(num_blocks, dtype=bool)
        self.cached = np.zeros(num_blocks, dtype=bool)

    def mark_free(self, block_id: int, free: bool) -> None:
        self.free[block_id] = free

    def mark_cached(self, block_id: int, cached: bool) -> None:
        self.cached[block_id] = cached

    def placeable(self, block_id: int) -> bool:
        """Free and empty: may take new K/V by placement."""
        return 0 <= block_id < len(self.free) and bool(self.free[block_id]) and not self.cached[block_id]

    def run_start(self, need: int) -> int:
        """Where `need` blocks start: the middle of the longest run of
        placeable blocks (its start when it is shorter); -1 when none is."""
        placeable = self.free & ~self.cached
        edges = np.diff(placeable.view(np.int8), prepend=0, append=0)
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if not len(starts):
            return -1
        longest = int(np.argmax(ends - starts))
        length = int(ends[longest] - starts[longest])
        return int(starts[longest]) + max(length - need, 0) // 2
