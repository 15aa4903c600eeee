"""Exact block ids and free-list order (in the spirit of vLLM's
test_prefix_caching.py): allocation from the head, frees to the tail with a
request's tail blocks evicted first, prefix hits, lazy eviction."""
from __future__ import annotations

import pytest

from python_llm.engine.core.block_pool import BlockPool, NoFreeBlocksError, hash_block
from python_llm.engine.core.kv_cache_manager import KVCacheManager
from python_llm.engine.core.request import Request
from python_llm.engine.core.sampling_params import SamplingParams

BS = 4


def make_request(rid: str, prompt: list[int]) -> Request:
    return Request(rid, prompt, SamplingParams(max_tokens=8))


def admit(kv: KVCacheManager, req: Request) -> int:
    """What the scheduler does for a waiting request, plus 'computing' it."""
    hits, num_cached = kv.get_computed_blocks(req)
    assert kv.allocate_slots(req, req.num_tokens - num_cached, hits)
    req.num_computed_tokens = req.num_tokens
    kv.cache_computed_blocks(req)
    return num_cached


def test_allocate_takes_head_and_free_appends_to_tail() -> None:
    pool = BlockPool(6)
    blocks = pool.allocate(3)
    assert [b.block_id for b in blocks] == [0, 1, 2]
    assert pool.free_block_ids() == [3, 4, 5]
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]
    pool.free([blocks[2], blocks[0]])
    assert pool.free_block_ids() == [3, 4, 5, 2, 0]
    assert pool.num_used_blocks == 1
    with pytest.raises(NoFreeBlocksError, match="asked for 6 blocks, 5 free"):
        pool.allocate(6)
    with pytest.raises(RuntimeError, match="block 0: freed with ref_cnt 0"):
        pool.free([blocks[0]])          # already at ref_cnt 0
    pool.check_invariants()


def test_request_blocks_are_freed_tail_first() -> None:
    kv = KVCacheManager(10, BS)
    req = make_request("a", list(range(10)))      # 2 full blocks + 2 tokens
    assert admit(kv, req) == 0
    assert kv.block_ids("a") == [0, 1, 2]
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9]
    kv.free(req)
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]
    assert kv.block_ids("a") == []
    kv.pool.check_invariants()


def test_prefix_hit_reuses_free_blocks_and_shares_live_ones() -> None:
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(10)))
    admit(kv, a)
    kv.free(a)
    # same first 8 tokens: blocks 0 and 1 come back from the free list
    b = make_request("b", list(range(8)) + [100, 101, 102])
    assert admit(kv, b) == 8
    assert kv.block_ids("b") == [0, 1, 3]
    assert kv.pool.free_block_ids() == [4, 5, 6, 7, 8, 9, 2]
    # a live request shares them: ref counts go to 2, nothing leaves the free list
    c = make_request("c", list(range(8)) + [200])
    assert admit(kv, c) == 8
    assert kv.block_ids("c") == [0, 1, 4]
    assert [kv.pool.blocks[i].ref_cnt for i in (0, 1, 3, 4)] == [2, 2, 1, 1]
    kv.free(b)
    assert [kv.pool.blocks[i].ref_cnt for i in (0, 1)] == [1, 1]
    assert kv.pool.free_block_ids() == [5, 6, 7, 8, 9, 2, 3]
    kv.pool.check_invariants()


def test_whole_prompt_is_never_served_from_cache() -> None:
    kv = KVCacheManager(10, BS)
    admit(kv, make_request("a", list(range(8))))          # 2 full blocks cached
    same = make_request("b", list(range(8)))
    hits, num_cached = kv.get_computed_blocks(same)
    assert num_cached == 4 and [b.block_id for b in hits] == [0]   # the last block is recomputed


def test_lazy_eviction_drops_the_hash_only_when_reused() -> None:
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(12)))                # 3 full blocks, all cached once computed
    admit(kv, a)
    kv.free(a)
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7, 8, 9, 2, 1, 0]
    # 8 blocks of unrelated tokens: 3..9 and then block 2 (a's tail) is evicted
    other = make_request("x", [500 + i for i in range(32)])
    kv.allocate_slots(other, 32)
    assert kv.block_ids("x") == [3, 4, 5, 6, 7, 8, 9, 2]
    assert kv.pool.blocks[2].block_hash is None
    probe = make_request("p", list(range(12)) + [7])
    hits, num_cached = kv.get_computed_blocks(probe)
    assert [b.block_id for b in hits] == [0, 1] and num_cached == 8
    kv.pool.check_invariants()


def test_allocation_fails_cleanly_when_blocks_run_out() -> None:
    kv = KVCacheManager(4, BS)
    a = make_request("a", list(range(12)))
    assert kv.allocate_slots(a, 12)
    b = make_request("b", [900 + i for i in range(8)])
    assert not kv.allocate_slots(b, 8)                    # 2 blocks asked, 1 free
    assert kv.block_ids("b") == [] and kv.num_free_blocks == 1
    # hits that sit in the free list count against the free blocks they occupy
    a.num_computed_tokens = 12
    kv.cache_computed_blocks(a)
    kv.free(a)
    c = make_request("c", list(range(8)) + [1, 2, 3, 4, 5, 6, 7, 8, 9])   # hits 2 blocks, needs 3 more
    hits, _ = kv.get_computed_blocks(c)
    assert len(hits) == 2
    assert not kv.allocate_slots(c, 9, hits)              # 4 free, 2 taken by hits, 3 needed
    assert kv.num_free_blocks == 4 and all(b.ref_cnt == 0 for b in hits)
    kv.pool.check_invariants()


def test_chained_hash_depends_on_the_parent() -> None:
    first = hash_block(None, [1, 2, 3, 4])
    assert hash_block(first, [5, 6, 7, 8]) != hash_block(hash_block(None, [0, 2, 3, 4]), [5, 6, 7, 8])
    assert hash_block(first, [5, 6, 7, 8]) == hash_block(hash_block(None, [1, 2, 3, 4]), [5, 6, 7, 8])


def test_no_reuse_when_caching_is_off() -> None:
    kv = KVCacheManager(10, BS, enable_caching=False)
    a = make_request("a", list(range(12)))
    admit(kv, a)
    kv.free(a)
    assert admit(kv, make_request("b", list(range(12)) + [1])) == 0
