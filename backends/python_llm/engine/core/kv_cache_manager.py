"""Per-request block tables over the BlockPool, and prefix-cache lookups.

Tokens at positions p of a request live in block `table[p // block_size]`.
Full blocks are published to the prefix cache only after the step that wrote
them has run (`cache_computed_blocks`), so a hit never points at K/V that is
still being written.
"""

from __future__ import annotations

from .block_pool import BlockHash, BlockPool, KVBlock, hash_block
from .request import Request


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = True) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size: must be > 0, got {block_size}")
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.pool = BlockPool(num_blocks, enable_caching)
        self._blocks: dict[str, list[KVBlock]] = {}
        # the same tables as block ids, by request id (read-only outside this
        # class); the runner gets copies of what they grew by (scheduler_output.py)
        self.tables: dict[str, list[int]] = {}
        self._num_cached_blocks: dict[str, int] = {}  # leading blocks already published

    # -- queries ---------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_used_blocks

    @property
    def capacity(self) -> int:
        return self.pool.capacity

    def block_ids(self, request_id: str) -> list[int]:
        return self.tables.get(request_id, [])

    def _ensure_block_hashes(self, request: Request, num_full_blocks: int) -> list[BlockHash]:
        hashes = request.block_hashes
        bs = self.block_size
        tokens = request.all_token_ids
        for i in range(len(hashes), num_full_blocks):
            hashes.append(hash_block(hashes[-1] if hashes else None, tokens[i * bs : (i + 1) * bs]))
        return hashes

    def get_computed_blocks(self, request: Request) -> tuple[list[KVBlock], int]:
        """Longest run of cached full blocks at the start of the request's
        tokens, and how many tokens they cover. The last token is never
        served from cache: its logits are needed to sample the next one."""
        if not self.enable_caching:
            return [], 0
        num_lookup_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._ensure_block_hashes(request, num_lookup_blocks)
        hits: list[KVBlock] = []
        get = self.pool.get_cached_block
        for i in range(num_lookup_blocks):
            block = get(hashes[i])
            if block is None:
                break
            hits.append(block)
        return hits, len(hits) * self.block_size

    # -- mutation --------------------------------------------------------------
    def allocate_slots(
        self, request: Request, num_new_tokens: int, new_computed_blocks: list[KVBlock] | None = None
    ) -> bool:
        """Make room for `num_new_tokens` more tokens after the request's
        computed ones (and after `new_computed_blocks`, prefix hits taken on
        first admission). False, with nothing changed, when blocks run out."""
        rid = request.request_id
        blocks = self._blocks.get(rid)
        hits = new_computed_blocks or []
        num_hit = len(hits)
        num_held = (len(blocks) if blocks is not None else 0) + num_hit
        total_tokens = request.num_computed_tokens + num_hit * self.block_size + num_new_tokens
        num_new_blocks = -(-total_tokens // self.block_size) - num_held
        if num_new_blocks <= 0 and not num_hit:
            return True  # the common decode step: the last block has room
        # hits sitting in the free list stop being free once touched
        num_hits_free = sum(b.ref_cnt == 0 for b in hits)
        if num_new_blocks > self.pool.num_free_blocks - num_hits_free:
            return False
        if blocks is None:
            blocks = self._blocks[rid] = []
            self.tables[rid] = []
            self._num_cached_blocks[rid] = 0
            if self.enable_caching:
                self._report_revivals(request, num_hit, num_hits_free)
        ids = self.tables[rid]
        if num_hit:
            self.pool.touch(hits)
            blocks.extend(hits)
            ids.extend(b.block_id for b in hits)
            self._num_cached_blocks[rid] = len(blocks)
        if num_new_blocks > 0:
            fresh = self.pool.allocate(num_new_blocks, ids[-1] if ids else None)
            blocks.extend(fresh)
            ids.extend(b.block_id for b in fresh)
        return True

    def _report_revivals(self, request: Request, num_hit: int, num_hits_free: int) -> None:
        """Tell placement how many of an admitted prompt's blocks came back
        from free blocks, or would have from blocks placement evicted."""
        looked_up = request.block_hashes[: (request.num_tokens - 1) // self.block_size]
        placement = self.pool.placement
        lost = 0
        for block_hash in looked_up[num_hit:]:
            if not placement.was_evicted(block_hash):
                break
            lost += 1
        placement.admitted(len(looked_up), num_hits_free + lost)

    def cache_computed_blocks(self, request: Request) -> None:
        """Publish the request's blocks that became full of computed K/V."""
        if not self.enable_caching:
            return
        rid = request.request_id
        num_full = request.num_computed_tokens // self.block_size
        done = self._num_cached_blocks.get(rid)
        if done is None or num_full <= done:
            return
        blocks = self._blocks[rid]
        hashes = self._ensure_block_hashes(request, num_full)
        cache = self.pool.cache_full_block
        for i in range(done, num_full):
            cache(blocks[i], hashes[i])
        self._num_cached_blocks[rid] = num_full

    def free(self, request: Request) -> None:
        """Release the request's blocks. Its tail blocks are evicted first:
        they are the least likely to be shared by another prompt."""
        rid = request.request_id
        blocks = self._blocks.pop(rid, None)
        self.tables.pop(rid, None)
        self._num_cached_blocks.pop(rid, None)
        if blocks:
            self.pool.free(reversed(blocks))
