"""Property test: random admit / append / fork (shared prefix) / free /
cancel sequences against the KV cache manager keep the pool consistent and
never serve a prefix hit whose slots hold other tokens."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from python_llm.engine.core.kv_cache_manager import KVCacheManager
from python_llm.engine.core.request import Request
from python_llm.engine.core.sampling_params import SamplingParams

BS = 4
NUM_BLOCKS = 12
tokens = st.lists(st.integers(0, 3), min_size=1, max_size=14)  # tiny alphabet: prefixes repeat


class KVCacheMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.kv = KVCacheManager(NUM_BLOCKS, BS)
        self.live: dict[str, Request] = {}
        self.slots: dict[int, int] = {}  # (block * BS + offset) -> token written there
        self.count = 0

    def _new_id(self) -> str:
        self.count += 1
        return f"r{self.count}"

    def _admit(self, prompt: list[int]) -> None:
        req = Request(self._new_id(), prompt, SamplingParams())
        hits, num_cached = self.kv.get_computed_blocks(req)
        assert num_cached < len(prompt)
        for i, block in enumerate(hits):  # a hit must hold exactly this prompt's tokens
            for off in range(BS):
                assert self.slots.get(block.block_id * BS + off) == prompt[i * BS + off]
        if not self.kv.allocate_slots(req, len(prompt) - num_cached, hits):
            assert all(b.ref_cnt >= 0 for b in hits)
            return
        req.num_computed_tokens = num_cached
        self._compute(req, len(prompt) - num_cached)
        self.live[req.request_id] = req

    def _compute(self, req: Request, n: int) -> None:
        table = self.kv.block_ids(req.request_id)
        for p in range(req.num_computed_tokens, req.num_computed_tokens + n):
            self.slots[table[p // BS] * BS + p % BS] = req.all_token_ids[p]
        req.num_computed_tokens += n
        self.kv.cache_computed_blocks(req)

    @rule(prompt=tokens)
    def admit(self, prompt: list[int]) -> None:
        self._admit(prompt)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), extra=tokens)
    def fork(self, data: st.DataObject, extra: list[int]) -> None:
        parent = data.draw(st.sampled_from(sorted(self.live)))
        history = self.live[parent].all_token_ids
        cut = data.draw(st.integers(1, len(history)))
        self._admit(history[:cut] + extra)

    @precondition(lambda self: self.live)
    @rule(data=st.data(), new=st.lists(st.integers(0, 3), min_size=1, max_size=6))
    def append(self, data: st.DataObject, new: list[int]) -> None:
        req = self.live[data.draw(st.sampled_from(sorted(self.live)))]
        for token in new:
            req.append_output_token(token, None)
        if self.kv.allocate_slots(req, len(new)):
            self._compute(req, len(new))
        else:  # what preemption does: give the blocks back, recompute later
            self.kv.free(req)
            del self.live[req.request_id]

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        req = self.live.pop(data.draw(st.sampled_from(sorted(self.live))))
        self.kv.free(req)

    @precondition(lambda self: self.live)
    @rule()
    def cancel_all(self) -> None:
        for req in self.live.values():
            self.kv.free(req)
        self.live.clear()

    @invariant()
    def pool_is_consistent(self) -> None:
        pool = self.kv.pool
        pool.check_invariants()
        free = pool.free_block_ids()
        assert len(free) == len(set(free))
        refs = [0] * NUM_BLOCKS
        for req in self.live.values():
            table = self.kv.block_ids(req.request_id)
            assert len(table) == -(-req.num_computed_tokens // BS)
            for block_id in table:
                refs[block_id] += 1
        assert refs == [b.ref_cnt for b in pool.blocks]
        assert pool.num_used_blocks == sum(1 for r in refs if r) and pool.num_used_blocks + len(free) == NUM_BLOCKS
        if not self.live:
            assert pool.num_free_blocks == NUM_BLOCKS


TestKVCacheMachine = KVCacheMachine.TestCase
TestKVCacheMachine.settings = settings(
    max_examples=100, stateful_step_count=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
