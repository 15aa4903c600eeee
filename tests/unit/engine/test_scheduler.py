"""Scheduler policy against a FakeRunner that checks every block table."""

from __future__ import annotations

import time
from collections.abc import Callable

from contract import metric_names as m
from python_llm.engine.config import EngineConfig
from python_llm.engine.core.metrics import InMemoryMetrics
from python_llm.engine.core.outputs import RequestOutput
from python_llm.engine.core.request import FinishReason, Request, RequestStatus
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler import Scheduler
from tests.unit.engine.engine_fakes import EOS, FakeRunner, expected_tokens


def make(num_blocks: int = 64, block_size: int = 4, max_model_len: int = 2048, **cfg: object):
    # pacing of long prefills follows measured step times: off here, so that
    # these tests see the token budget alone (test_prefill_pacer.py drives it
    # with a fake clock)
    cfg.setdefault("prefill_time_ratio", 0.0)
    config = EngineConfig(
        model_dir="unused", block_size=block_size, max_tokens_in_paged_kv_cache=num_blocks * block_size, **cfg
    )  # type: ignore[arg-type]
    metrics = InMemoryMetrics()
    return Scheduler(config, num_blocks, max_model_len, metrics), FakeRunner(num_blocks, block_size), metrics


def req(
    rid: str, prompt_len: int = 6, max_tokens: int = 4, priority: int = 0, base: int = 100, **sp: object
) -> Request:
    params = SamplingParams(max_tokens=max_tokens, stop_token_ids=[EOS], **sp)  # type: ignore[arg-type]
    return Request(rid, [base + i for i in range(prompt_len)], params, priority=priority)


def step(sched: Scheduler, runner: FakeRunner) -> list[RequestOutput]:
    out = sched.schedule()
    if out.is_empty:
        return []
    return sched.update_from_output(out, runner.execute(out))


def run_all(sched: Scheduler, runner: FakeRunner, max_steps: int = 500) -> dict[str, list[RequestOutput]]:
    outs: dict[str, list[RequestOutput]] = {}
    for _ in range(max_steps):
        if not sched.has_unfinished_requests():
            return outs
        for o in step(sched, runner):
            outs.setdefault(o.request_id, []).append(o)
    raise AssertionError("requests did not finish")


def tokens_of(outs: list[RequestOutput]) -> list[int]:
    return [t for o in outs for t in o.new_token_ids]


def test_token_budget_and_sequence_limit() -> None:
    sched, runner, _ = make(max_num_seqs=4, max_num_batched_tokens=32)
    for i in range(6):
        sched.add_request(req(f"r{i}", prompt_len=10, base=100 * i))
    out = sched.schedule()
    assert [(rid, n) for rid, _, n in out.chunks()] == [("r0", 10), ("r1", 10), ("r2", 10), ("r3", 2)]
    assert out.total_num_scheduled_tokens == 32
    assert sched.num_running == 4 and sched.num_waiting == 2
    sched.update_from_output(out, runner.execute(out))
    out = sched.schedule()  # 3 decodes + the rest of r3's prompt; r4 and r5 wait for a slot
    assert [(rid, n) for rid, _, n in out.chunks()] == [("r0", 1), ("r1", 1), ("r2", 1), ("r3", 8)]


def test_higher_priority_first_then_fcfs() -> None:
    sched, _, _ = make(max_num_seqs=8)
    for i, (rid, prio) in enumerate([("a", 0), ("b", 0), ("c", 5), ("d", 5), ("e", -1)]):
        sched.add_request(req(rid, priority=prio, base=100 * i))
    out = sched.schedule()
    assert out.req_ids() == ["c", "d", "a", "b", "e"]


def test_chunked_prefill_keeps_decodes_flowing() -> None:
    sched, runner, _ = make(max_num_batched_tokens=16, max_num_seqs=4)
    sched.add_request(req("s1", max_tokens=30))
    sched.add_request(req("s2", max_tokens=30))
    step(sched, runner)
    sched.add_request(req("long", prompt_len=100, max_tokens=2, base=300, priority=9))  # even a higher priority
    chunks = []
    while True:
        outs = {o.request_id: o for o in step(sched, runner)}
        assert len(outs["s1"].new_token_ids) == 1 and len(outs["s2"].new_token_ids) == 1
        chunks.append(runner.history[-1][-1])
        if "long" in outs:
            break
    assert [c[2] for c in chunks] == [14] * 7 + [2]  # 100 tokens in budget-sized chunks
    assert [c[3] for c in chunks] == [False] * 7 + [True]  # sampled only at the end of the prompt


def test_no_chunking_waits_for_a_step_with_room() -> None:
    sched, runner, _ = make(max_num_batched_tokens=16, max_num_seqs=4, enable_chunked_context=False)
    sched.add_request(req("s1", max_tokens=5))
    step(sched, runner)
    sched.add_request(req("a", prompt_len=10, base=300))
    sched.add_request(req("b", prompt_len=10, base=400))
    out = sched.schedule()
    assert [(rid, n) for rid, _, n in out.chunks()] == [("s1", 1), ("a", 10)]


def test_preemption_picks_latest_admitted_and_output_is_unchanged() -> None:
    sched, runner, metrics = make(num_blocks=6, block_size=4)  # 24 slots, two requests need 32
    sched.add_request(req("a", prompt_len=4, max_tokens=12, base=100))
    sched.add_request(req("b", prompt_len=4, max_tokens=12, base=200))
    statuses = []
    outs: dict[str, list[RequestOutput]] = {}
    while sched.has_unfinished_requests():
        for o in step(sched, runner):
            outs.setdefault(o.request_id, []).append(o)
        statuses.append(
            (
                sched.requests.get("a") and sched.requests["a"].status,
                sched.requests.get("b") and sched.requests["b"].status,
            )
        )
    # both hold 3 blocks at position 12 and need a fourth: the later one goes, once
    assert metrics.counter(m.PREEMPTIONS) == 1
    assert any(s[1] is RequestStatus.PREEMPTED for s in statuses)
    assert not any(s[0] is RequestStatus.PREEMPTED for s in statuses)
    for rid in ("a", "b"):
        assert tokens_of(outs[rid]) == expected_tokens(rid, 12)
        assert outs[rid][-1].finish_reason == "length"
    assert sched.kv.num_used_blocks == 0
    # the runner was told (and the fake checked that b came back whole, its
    # output so far included, or its KV check would have failed)
    assert runner.preempted_ids == ["b"]


def test_the_message_sends_a_request_once_then_only_its_changes() -> None:
    sched, runner, _ = make(block_size=4)
    sched.add_request(req("a", prompt_len=6, max_tokens=8))
    first = sched.schedule()
    (new,) = first.scheduled_new_reqs
    assert (new.request_id, new.token_ids, new.num_prompt_tokens, new.num_computed_tokens) == (
        "a",
        tuple(range(100, 106)),
        6,
        0,
    )
    assert new.block_ids == tuple(sched.kv.tables["a"]) and len(new.block_ids) == 2
    assert first.num_scheduled_tokens == [6] and not first.scheduled_cached_reqs.req_ids
    sched.update_from_output(first, runner.execute(first))
    grown = []
    for position in range(6, 12):
        out = sched.schedule()
        cached = out.scheduled_cached_reqs
        assert not out.scheduled_new_reqs and cached.req_ids == ["a"] and out.num_scheduled_tokens == [1]
        assert cached.num_computed_tokens == [position]
        grown.append(cached.new_block_ids[0])
        sched.update_from_output(out, runner.execute(out))
    # a new block only when the decode crosses into it (position 8)
    assert grown == [None, None, (sched.kv.tables["a"][2],), None, None, None]


def test_the_message_shares_nothing_the_scheduler_changes() -> None:
    sched, runner, _ = make(block_size=4)
    request = req("a", prompt_len=8, max_tokens=8)
    sched.add_request(request)
    out = sched.schedule()
    (new,) = out.scheduled_new_reqs
    sent_tokens, sent_blocks = new.token_ids, new.block_ids
    sched.update_from_output(out, runner.execute(out))
    for _ in range(4):  # tokens appended, a block added
        step(sched, runner)
    assert new.token_ids == sent_tokens and len(new.token_ids) == 8
    assert new.block_ids == sent_blocks and len(sched.kv.tables["a"]) > len(sent_blocks)


def test_preemption_spares_higher_priority_even_if_admitted_later() -> None:
    sched, runner, metrics = make(num_blocks=6, block_size=4)
    sched.add_request(req("low", prompt_len=4, max_tokens=12, base=100))
    outs = {o.request_id: [o] for o in step(sched, runner)}
    sched.add_request(req("high", prompt_len=4, max_tokens=12, base=200, priority=1))
    preempted = set()
    while sched.has_unfinished_requests():
        for o in step(sched, runner):
            outs.setdefault(o.request_id, []).append(o)
        preempted |= {r.request_id for r in sched.waiting if r.status is RequestStatus.PREEMPTED}
    assert preempted == {"low"}
    assert tokens_of(outs["low"]) == expected_tokens("low", 12)
    assert tokens_of(outs["high"]) == expected_tokens("high", 12)


def test_prefix_cache_hits_cover_shared_full_blocks() -> None:
    sched, runner, metrics = make(block_size=4)
    shared = list(range(100, 118))  # 18 tokens: 4 full blocks
    first = Request("first", shared + [1, 2], SamplingParams(max_tokens=2))
    sched.add_request(first)
    run_all(sched, runner)
    second = Request("second", shared + [3, 4, 5], SamplingParams(max_tokens=2))
    sched.add_request(second)
    outs = run_all(sched, runner)
    # the 4 shared full blocks; the fifth differs ([116, 117, 1, 2] vs [116, 117, 3, 4])
    assert outs["second"][-1].num_cached_prompt_tokens == 4 * 4
    assert metrics.counter(m.PREFIX_CACHE_HIT_TOKENS) == 16
    assert runner.history[-2][0][1] == outs["second"][-1].num_cached_prompt_tokens  # prefill starts after the hit


def scripted(script: dict[str, list[int]]) -> Callable[[str, int], int]:
    return lambda rid, i: script[rid][i] if i < len(script[rid]) else 50


def test_stop_conditions() -> None:
    sched, runner, _ = make()
    runner.token_fn = scripted(
        {
            "eos": [11, 12, EOS, 13],
            "min": [EOS, 11, EOS, 12, EOS],
            "ignore": [11, EOS, 12, 13],
            "word": [11, 7, 8, 9, 12],
            "word_min": [7, 8, 9, 7, 8, 9, 1],
            "len": [11, 12, 13, 14, 15],
        }
    )
    sched.add_request(req("eos", max_tokens=10))
    sched.add_request(req("min", max_tokens=10, min_tokens=2))
    sched.add_request(req("ignore", max_tokens=4, ignore_eos=True))
    sched.add_request(req("word", max_tokens=10, stop_words_ids=[[5, 9], [8, 9]]))
    sched.add_request(req("word_min", max_tokens=10, min_tokens=4, stop_words_ids=[[8, 9]]))
    sched.add_request(req("len", max_tokens=3))
    outs = run_all(sched, runner)
    result = {rid: (tokens_of(o), o[-1].finish_reason, o[-1].num_output_tokens) for rid, o in outs.items()}
    assert result["eos"] == ([11, 12], "stop", 2)  # EOS ends it and is not returned
    assert result["min"] == ([EOS, 11], "stop", 2)  # EOS before min_tokens is just a token
    assert result["ignore"] == ([11, EOS, 12, 13], "length", 4)
    assert result["word"] == ([11, 7, 8, 9], "stop", 4)  # stop words are returned
    assert result["word_min"] == ([7, 8, 9, 7, 8, 9], "stop", 6)
    assert result["len"] == ([11, 12, 13], "length", 3)
    assert sched.kv.num_used_blocks == 0
    # the runner is told to drop finished requests' state with the next step:
    # eos, min and len end at the 3rd token, ignore and word at the 4th;
    # word_min ends in the last step, so no step tells the runner about it
    assert runner.dropped_ids == ["eos", "min", "len", "ignore", "word"]


def test_max_model_len_ends_with_length() -> None:
    sched, runner, _ = make(max_model_len=10)
    sched.add_request(req("r", prompt_len=6, max_tokens=50))
    outs = run_all(sched, runner)["r"]
    assert len(tokens_of(outs)) == 4 and outs[-1].finish_reason == "length"


def test_abort_and_timeout_free_blocks() -> None:
    sched, runner, metrics = make()
    sched.add_request(req("a", max_tokens=50, base=100))
    sched.add_request(req("b", max_tokens=50, base=200))
    step(sched, runner)
    assert sched.kv.num_used_blocks > 0
    [done] = sched.abort(["a", "unknown"])
    assert done.finished and done.finish_reason == "cancelled" and done.new_token_ids == []
    assert metrics.counter(m.REQUESTS_CANCELLED) == 1
    timed = Request("t", [1, 2, 3], SamplingParams(max_tokens=5), token_timeout_ms=1000)
    sched.add_request(timed)
    assert sched.expire_timeouts() == []
    [expired] = sched.expire_timeouts(now_mono_ns=time.monotonic_ns() + 2_000_000_000)
    assert expired.request_id == "t" and expired.finish_reason == "timeout"
    assert metrics.counter(m.REQUESTS_TIMED_OUT) == 1
    [ended] = sched.abort_all(FinishReason.ERROR, "engine failed: x")
    assert ended.request_id == "b" and ended.error == "engine failed: x"
    assert sched.kv.num_used_blocks == 0 and not sched.has_unfinished_requests()
