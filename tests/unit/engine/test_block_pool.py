"""Exact block ids and free-list order (in the spirit of vLLM's
test_prefix_caching.py): placement of empty blocks in runs, else allocation
from the head, frees to the tail with a request's tail blocks evicted first,
prefix hits, lazy eviction."""

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


def ids(blocks) -> list[int]:
    return [b.block_id for b in blocks]


def test_allocate_places_a_run_and_free_appends_to_tail() -> None:
    pool = BlockPool(6)
    blocks = pool.allocate(3)
    assert ids(blocks) == [1, 2, 3]  # the middle of the one run: room on both sides
    assert pool.free_block_ids() == [0, 4, 5]
    assert [b.ref_cnt for b in blocks] == [1, 1, 1]
    pool.free([blocks[2], blocks[0]])
    assert pool.free_block_ids() == [0, 4, 5, 3, 1]
    assert pool.num_used_blocks == 1
    with pytest.raises(NoFreeBlocksError, match="asked for 6 blocks, 5 free"):
        pool.allocate(6)
    with pytest.raises(RuntimeError, match="block 1: freed with ref_cnt 0"):
        pool.free([blocks[0]])  # already at ref_cnt 0
    pool.check_invariants()


def test_request_blocks_are_freed_tail_first() -> None:
    kv = KVCacheManager(10, BS)
    req = make_request("a", list(range(10)))  # 2 full blocks + 2 tokens
    assert admit(kv, req) == 0
    assert kv.block_ids("a") == [3, 4, 5]
    assert kv.pool.free_block_ids() == [0, 1, 2, 6, 7, 8, 9]
    kv.free(req)
    assert kv.pool.free_block_ids() == [0, 1, 2, 6, 7, 8, 9, 5, 4, 3]
    assert kv.block_ids("a") == []
    kv.pool.check_invariants()


def test_prefix_hit_reuses_free_blocks_and_shares_live_ones() -> None:
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(10)))
    admit(kv, a)
    kv.free(a)
    # same first 8 tokens: blocks 3 and 4 come back from the free list, and
    # the new one follows them (a's partial block 5, empty)
    b = make_request("b", list(range(8)) + [100, 101, 102])
    assert admit(kv, b) == 8
    assert kv.block_ids("b") == [3, 4, 5]
    assert kv.pool.free_block_ids() == [0, 1, 2, 6, 7, 8, 9]
    # a live request shares them: ref counts go to 2, nothing leaves the free
    # list; its own block goes to the middle of the longest run (6-9)
    c = make_request("c", list(range(8)) + [200])
    assert admit(kv, c) == 8
    assert kv.block_ids("c") == [3, 4, 7]
    assert [kv.pool.blocks[i].ref_cnt for i in (3, 4, 5, 7)] == [2, 2, 1, 1]
    kv.free(b)
    assert [kv.pool.blocks[i].ref_cnt for i in (3, 4)] == [1, 1]
    assert kv.pool.free_block_ids() == [0, 1, 2, 6, 8, 9, 5]
    kv.pool.check_invariants()


def test_whole_prompt_is_never_served_from_cache() -> None:
    kv = KVCacheManager(10, BS)
    admit(kv, make_request("a", list(range(8))))  # 2 full blocks cached
    same = make_request("b", list(range(8)))
    hits, num_cached = kv.get_computed_blocks(same)
    assert num_cached == 4 and [b.block_id for b in hits] == [4]  # the last block is recomputed


def test_lazy_eviction_drops_the_hash_only_when_reused() -> None:
    kv = KVCacheManager(10, BS)
    a = make_request("a", list(range(12)))  # 3 full blocks, all cached once computed
    admit(kv, a)
    kv.free(a)
    assert kv.pool.free_block_ids() == [0, 1, 2, 6, 7, 8, 9, 5, 4, 3]
    kv.pool.placement.admitted(1, 1)  # as a prompt that came back from free blocks would
    # 8 blocks of unrelated tokens: the empty ones first, by runs (6-9, then
    # 0-2), then the free list's head, block 5 (a's tail), is evicted
    other = make_request("x", [500 + i for i in range(32)])
    kv.allocate_slots(other, 32)
    assert kv.block_ids("x") == [6, 7, 8, 9, 0, 1, 2, 5]
    assert kv.pool.blocks[5].block_hash is None
    probe = make_request("p", list(range(12)) + [7])
    hits, num_cached = kv.get_computed_blocks(probe)
    assert [b.block_id for b in hits] == [3, 4] and num_cached == 8
    kv.pool.check_invariants()


def test_allocation_fails_cleanly_when_blocks_run_out() -> None:
    kv = KVCacheManager(4, BS)
    a = make_request("a", list(range(12)))
    assert kv.allocate_slots(a, 12)
    b = make_request("b", [900 + i for i in range(8)])
    assert not kv.allocate_slots(b, 8)  # 2 blocks asked, 1 free
    assert kv.block_ids("b") == [] and kv.num_free_blocks == 1
    # hits that sit in the free list count against the free blocks they occupy
    a.num_computed_tokens = 12
    kv.cache_computed_blocks(a)
    kv.free(a)
    c = make_request("c", list(range(8)) + [1, 2, 3, 4, 5, 6, 7, 8, 9])  # hits 2 blocks, needs 3 more
    hits, _ = kv.get_computed_blocks(c)
    assert len(hits) == 2
    assert not kv.allocate_slots(c, 9, hits)  # 4 free, 2 taken by hits, 3 needed
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


def test_a_request_grows_in_place_else_in_the_middle_of_the_longest_run() -> None:
    pool = BlockPool(16)
    a = pool.allocate(2)
    assert ids(a) == [7, 8]
    b = pool.allocate(2)  # runs 0-6 and 9-15: the first of the longest
    assert ids(b) == [2, 3]
    assert ids(pool.allocate(1, after=8)) == [9]  # a grows in place
    assert ids(pool.allocate(2, after=3)) == [4, 5]  # so does b
    # block 2 is b's: the longest run left is 10-15, and its middle
    assert ids(pool.allocate(1, after=1)) == [12]
    assert ids(pool.allocate(1, after=15)) == [14]  # past the end: runs 0-1, 6, 10-11, 13-15
    pool.check_invariants()


def test_cached_free_blocks_are_left_to_the_lru_order_while_prompts_revive_them() -> None:
    """Once a prompt comes back from free cached blocks, placement takes only
    empty ones; a cached one goes by the free list's order, after them."""
    kv = KVCacheManager(8, BS)
    a = make_request("a", list(range(8)) + [99])  # 2 full blocks, cached once computed, and 1 partial
    admit(kv, a)
    assert kv.block_ids("a") == [2, 3, 4]
    kv.free(a)
    b = make_request("b", list(range(8)) + [98])  # a's two full blocks, from the free list
    assert admit(kv, b) == 8
    assert not kv.pool.placement.over_cached
    assert kv.block_ids("b") == [2, 3, 4]  # a's partial block: empty, and next
    kv.free(b)
    x = make_request("x", [500 + i for i in range(24)])
    assert kv.allocate_slots(x, 24)
    assert kv.block_ids("x") == [4, 5, 6, 7, 0, 1]  # 2 and 3 skipped: they hold a's prefix
    hits, num_cached = kv.get_computed_blocks(make_request("p", list(range(8)) + [1]))
    assert ids(hits) == [2, 3] and num_cached == 8
    y = make_request("y", [700 + i for i in range(4)])
    assert kv.allocate_slots(y, 4)
    assert kv.block_ids("y") == [3]  # nothing empty left: the LRU head (b's tail first)
    assert kv.pool.blocks[3].block_hash is None
    kv.pool.check_invariants()


def test_cached_free_blocks_are_placed_over_until_a_prompt_would_have_hit_them() -> None:
    """While no prompt comes back from free blocks, placement takes cached
    ones too; a prompt that would have hit blocks it evicted (their hashes
    are remembered) turns that off."""
    kv = KVCacheManager(12, BS)
    a = make_request("a", list(range(8)) + [99])
    admit(kv, a)
    assert kv.block_ids("a") == [4, 5, 6]
    kv.free(a)
    assert kv.pool.placement.over_cached
    x = make_request("x", [500 + i for i in range(24)])
    assert kv.allocate_slots(x, 24)
    assert kv.block_ids("x") == [3, 4, 5, 6, 7, 8]  # the middle of the whole pool, over a's blocks
    assert kv.pool.blocks[4].block_hash is None and kv.pool.blocks[5].block_hash is None
    again = make_request("a2", list(range(8)) + [99])
    assert kv.get_computed_blocks(again) == ([], 0)
    assert kv.allocate_slots(again, 9)
    assert not kv.pool.placement.over_cached  # 2 of 2 blocks looked up were lost
    assert kv.block_ids("a2") == [0, 1, 2]
    kv.pool.check_invariants()


def test_a_shuffled_free_list_still_gives_a_request_one_run() -> None:
    """The free list's order after churn is random; the blocks handed out are
    still neighbours."""
    pool = BlockPool(64)
    taken = pool.allocate(64)
    order = [taken[i] for i in (37, 5, 60, 12, 33, 48, 1, 22, 9, 56, 41, 17)]
    pool.free(order)
    # free: 1, 5, 9, 12, 17, 22, 33, 37, 41, 48, 56, 60 -- no two adjacent
    pool.free([taken[i] for i in range(24, 33)])  # and the run 24-32
    grown = pool.allocate(3)
    assert ids(grown) == [27, 28, 29]  # the middle of the run
    assert ids(pool.allocate(2, after=29)) == [30, 31]
    pool.check_invariants()
