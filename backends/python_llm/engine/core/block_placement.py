"""Where new KV blocks go: right after the request's last block when that one
is free and placeable, else in the middle of the longest run of placeable
free blocks.

Why: the CPU decode attention streams each sequence's K and V block by block,
and memory reads a run of neighbouring blocks faster than scattered ones. On
the 2-core AMX Xeon, 64 sequences x 200 tokens, decode attention 23.5 ms a
step with each sequence's blocks in one run, 25.0 ms interleaved (what taking
the free list's head gives decodes that grow side by side), 31.3 ms shuffled;
a long-running pool's tables are shuffled (docs/benchmarks.md, "Issue 18 on
the AMX machine: KV blocks placed in runs"). The middle, not the start, of
the longest run: the request before the run grows into its first half, the
new one into the second.

Which free blocks are placeable: the empty ones (holding no cached block),
and the cached ones too while prompts rarely revive free cached blocks.
Placing over a cached block evicts it out of the free list's LRU order; on
a multi-turn workload that lost a third to half of the prefix hits. So each
admission reports how many of its prompt's blocks were hits on free blocks,
or would have been on blocks placement evicted (a bounded record of their
hashes, as ARC keeps ghost entries), and cached blocks are placeable only
while those stay under REVIVED_SHARE of the prompt blocks looked up.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable

import numpy as np

# cached free blocks are placeable while revived (or lost) prompt blocks stay
# under this share of the prompt blocks looked up
REVIVED_SHARE = 0.01
# weight of the admissions before the last in that share: ~64 admissions
DECAY = 1.0 / 64


class BlockPlacement:
    """Per block id: free, and holding a cached block (the pool reports every
    change); whether cached free blocks are placeable now."""

    def __init__(self, num_blocks: int) -> None:
        self.free = np.ones(num_blocks, dtype=bool)
        self.cached = np.zeros(num_blocks, dtype=bool)
        self.over_cached = True  # no prompt has revived a free block yet
        self._evicted: OrderedDict[Hashable, None] = OrderedDict()  # hashes placement evicted, oldest first
        self._looked_up = 0.0  # decayed sums over admissions
        self._revived = 0.0

    def mark_free(self, block_id: int, free: bool) -> None:
        self.free[block_id] = free

    def mark_cached(self, block_id: int, cached: bool) -> None:
        self.cached[block_id] = cached

    def placeable(self, block_id: int) -> bool:
        return (
            0 <= block_id < len(self.free)
            and bool(self.free[block_id])
            and (self.over_cached or not self.cached[block_id])
        )

    def run_start(self, need: int) -> int:
        """Where `need` blocks start: the middle of the longest run of
        placeable blocks (its start when it is shorter); -1 when none is."""
        placeable = self.free if self.over_cached else self.free & ~self.cached
        edges = np.diff(placeable.view(np.int8), prepend=0, append=0)
        starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
        if not len(starts):
            return -1
        longest = int(np.argmax(ends - starts))
        length = int(ends[longest] - starts[longest])
        return int(starts[longest]) + max(length - need, 0) // 2

    def evicted(self, block_hash: Hashable) -> None:
        """Placement took a cached free block: remember what it held."""
        self._evicted[block_hash] = None
        self._evicted.move_to_end(block_hash)
        if len(self._evicted) > len(self.free):
            self._evicted.popitem(last=False)

    def was_evicted(self, block_hash: Hashable) -> bool:
        return block_hash in self._evicted

    def admitted(self, looked_up: int, revived: int) -> None:
        """An admission looked up `looked_up` prompt blocks, of which
        `revived` were hits on free blocks or on blocks placement evicted."""
        self._looked_up += looked_up - DECAY * self._looked_up
        self._revived += revived - DECAY * self._revived
        self.over_cached = self._revived <= REVIVED_SHARE * self._looked_up
