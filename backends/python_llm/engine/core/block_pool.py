"""Fixed-size KV blocks: ref counts, an LRU free list, and the prefix cache.

As in vLLM v1: the free list is also the eviction order (freed blocks join
the tail), a full block is cached under a hash chained over its parent's hash
and its own token ids, and a freed block keeps its hash (and stays a cache
hit) until allocation reuses it (lazy eviction). Unlike vLLM, allocation
takes the free blocks placement allows where it puts them first
(`block_placement.py`: after the request's last block, else in a run; empty
ones, and cached ones while prompts rarely revive those), and the list's
head (LRU) only when none is left.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from .block_placement import BlockPlacement


class BlockHash(NamedTuple):
    """Dict key of a cached block. The token ids are part of the key so that a
    collision of `value` alone can never serve the wrong tokens."""

    value: int
    token_ids: tuple[int, ...]


def hash_block(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    tokens = tuple(token_ids)
    return BlockHash(hash((parent.value if parent is not None else 0, tokens)), tokens)


class NoFreeBlocksError(RuntimeError):
    """Internal: callers check `num_free_blocks` first, so this means a bug."""


class KVBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.block_hash: BlockHash | None = None  # set only while this block is in the cache map

    def __repr__(self) -> str:
        return f"KVBlock({self.block_id}, ref={self.ref_cnt}, cached={self.block_hash is not None})"


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks: must be > 0, got {num_blocks}")
        self.enable_caching = enable_caching
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # block_id -> block, head = next to allocate (least recently freed)
        self._free: OrderedDict[int, KVBlock] = OrderedDict((b.block_id, b) for b in self.blocks)
        self._cached: dict[BlockHash, KVBlock] = {}
        self.placement = BlockPlacement(num_blocks)

    @property
    def capacity(self) -> int:
        return len(self.blocks)

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return len(self.blocks) - len(self._free)

    def free_block_ids(self) -> list[int]:
        """Free list in eviction order (head first); for tests and debugging."""
        return list(self._free)

    def get_cached_block(self, block_hash: BlockHash) -> KVBlock | None:
        return self._cached.get(block_hash)

    def allocate(self, n: int, after: int | None = None) -> list[KVBlock]:
        """Take `n` free blocks, evicting their old cache entries: the
        placeable ones after block `after` (the request's last), else where
        placement starts a run of them, else the free list's head."""
        free = self._free
        if n > len(free):
            raise NoFreeBlocksError(f"asked for {n} blocks, {len(free)} free")
        placement = self.placement
        out: list[KVBlock] = []
        at = after + 1 if after is not None else -1
        searching = True  # until placement finds no run: then the head for the rest
        while len(out) < n:
            if not placement.placeable(at):
                at = placement.run_start(n - len(out)) if searching else -1
                searching = at >= 0
            block = free.pop(at) if at >= 0 else free.popitem(last=False)[1]
            placement.mark_free(block.block_id, False)
            if block.block_hash is not None:
                if at >= 0:  # out of the LRU order
                    placement.evicted(block.block_hash)
                self._evict(block)
            block.ref_cnt = 1
            out.append(block)
            at = block.block_id + 1
        return out

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """Take a reference on prefix-cache hits; a hit on a free block pulls
        it out of the free list."""
        for block in blocks:
            if block.ref_cnt == 0:
                del self._free[block.block_id]
                self.placement.mark_free(block.block_id, False)
            block.ref_cnt += 1

    def free(self, blocks: Iterable[KVBlock]) -> None:
        """Drop one reference each. Blocks reaching zero join the free-list
        tail in the order given, so pass the ones to evict first first."""
        free = self._free
        for block in blocks:
            if block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id}: freed with ref_cnt {block.ref_cnt}")
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                free[block.block_id] = block
                self.placement.mark_free(block.block_id, True)

    def cache_full_block(self, block: KVBlock, block_hash: BlockHash) -> bool:
        """Publish a full block under its hash. False when caching is off or
        another block already holds the same content (that one stays the hit)."""
        if not self.enable_caching or block.block_hash is not None:
            return False
        if block_hash in self._cached:
            return False
        block.block_hash = block_hash
        self._cached[block_hash] = block
        self.placement.mark_cached(block.block_id, True)
        return True

    def _evict(self, block: KVBlock) -> None:
        block_hash = block.block_hash
        if block_hash is not None and self._cached.get(block_hash) is block:
            del self._cached[block_hash]
        block.block_hash = None
        self.placement.mark_cached(block.block_id, False)

    def check_invariants(self) -> None:
        """Raise RuntimeError when the pool's bookkeeping is inconsistent."""
        problems = []
        if len(self._free) != sum(1 for b in self.blocks if b.ref_cnt == 0):
            problems.append("free list size != blocks with ref_cnt 0")
        for block_id, block in self._free.items():
            if block.block_id != block_id or block.ref_cnt != 0:
                problems.append(f"block {block_id} is free with ref_cnt {block.ref_cnt}")
        for block in self.blocks:
            if block.ref_cnt < 0:
                problems.append(f"block {block.block_id}: negative ref_cnt")
        for block_hash, block in self._cached.items():
            if block.block_hash != block_hash:
                problems.append(f"block {block.block_id}: cache map and block disagree on its hash")
        if self.num_used_blocks + self.num_free_blocks != self.capacity:
            problems.append("used + free != capacity")
        placement = self.placement
        if any(bool(placement.free[b.block_id]) != (b.ref_cnt == 0) for b in self.blocks):
            problems.append("placement's free blocks != blocks with ref_cnt 0")
        if any(bool(placement.cached[b.block_id]) != (b.block_hash is not None) for b in self.blocks):
            problems.append("placement's cached blocks != blocks with a hash")
        if problems:
            raise RuntimeError("block pool invariants broken: " + "; ".join(problems))
