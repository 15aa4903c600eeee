"""LLMEngine with its loop thread: racing aborts, timeouts, death, shutdown."""

from __future__ import annotations

import gc
import random
import threading
import time
from collections import defaultdict

import pytest

from contract import metric_names as m
from python_llm.engine.config import EngineConfig
from python_llm.engine.core.errors import EngineDeadError
from python_llm.engine.core.metrics import InMemoryMetrics
from python_llm.engine.core.outputs import RequestOutput
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.engine import LLMEngine
from python_llm.engine.launch import launch
from tests.unit.engine.engine_fakes import FakeRunner, SlowFakeRunner

WAIT_S = 20.0


class Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outputs: dict[str, list[RequestOutput]] = defaultdict(list)
        self.finished: dict[str, int] = defaultdict(int)
        self.finished_at: dict[str, float] = {}  # time.monotonic() of the final output
        self.done = threading.Condition(self.lock)

    def __call__(self, out: RequestOutput) -> None:
        with self.lock:
            self.outputs[out.request_id].append(out)
            if out.finished:
                self.finished[out.request_id] += 1
                self.finished_at[out.request_id] = time.monotonic()
                self.done.notify_all()

    def wait_finished(self, ids: set[str], timeout: float = WAIT_S) -> None:
        with self.lock:
            if not self.done.wait_for(lambda: ids <= set(self.finished), timeout):
                raise AssertionError(f"{len(ids - set(self.finished))} requests never finished")

    def final(self, rid: str) -> RequestOutput:
        return self.outputs[rid][-1]


def config(**overrides: object) -> EngineConfig:
    base = dict(
        model_dir="unused",
        block_size=4,
        max_tokens_in_paged_kv_cache=4 * 96,
        max_num_seqs=16,
        max_num_batched_tokens=64,
        max_queue_size=1000,
    )
    base.update(overrides)
    return EngineConfig(**base)  # type: ignore[arg-type]


def test_racing_aborts_lose_no_request_and_free_every_block() -> None:
    cfg = config()
    metrics = InMemoryMetrics()
    engine = LLMEngine(cfg, runner=FakeRunner.for_config(cfg), metrics=metrics)
    engine.start()
    collect = Collector()
    ids_per_thread = 75
    shared_prefix = list(range(40, 56))  # some prompts share blocks, so aborts hit shared blocks too

    def client(t: int) -> None:
        rng = random.Random(t)
        mine = []
        for i in range(ids_per_thread):
            rid = f"t{t}-{i}"
            prefix = shared_prefix if rng.random() < 0.5 else []
            tokens = prefix + [rng.randrange(10, 999) for _ in range(rng.randrange(1, 30))]
            engine.add_request(rid, tokens, SamplingParams(max_tokens=rng.randrange(1, 12)), on_output=collect)
            mine.append(rid)
            if rng.random() < 0.5:
                engine.abort(rng.choice(mine))  # maybe live, maybe finished, maybe aborted twice
            if rng.random() < 0.1:
                time.sleep(0.001)
        for rid in rng.sample(mine, 10):
            engine.abort(rid)

    threads = [threading.Thread(target=client, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    all_ids = {f"t{t}-{i}" for t in range(4) for i in range(ids_per_thread)}
    collect.wait_finished(all_ids)
    engine.shutdown(timeout=5)

    assert all(collect.finished[rid] == 1 for rid in all_ids)  # one final output each, none lost
    reasons = defaultdict(int)
    for rid in all_ids:
        reasons[collect.final(rid).finish_reason] += 1
        assert all(not o.finished for o in collect.outputs[rid][:-1])
    print(f"racing aborts: {dict(reasons)}")
    assert set(reasons) <= {"length", "cancelled"} and reasons["cancelled"] > 0
    assert metrics.counter(m.REQUESTS_CANCELLED) == reasons["cancelled"]
    stats = engine.stats()
    assert stats.blocks_used == 0 and stats.running == 0 and stats.waiting == 0
    engine.scheduler.kv.pool.check_invariants()


def test_token_timeout_fires_during_slow_steps() -> None:
    cfg = config(debug_step_delay_ms=300)
    metrics = InMemoryMetrics()
    engine = LLMEngine(cfg, runner=FakeRunner.for_config(cfg), metrics=metrics)
    engine.start()
    collect = Collector()
    started = time.monotonic()
    engine.add_request("slow", [11, 12, 13], SamplingParams(max_tokens=50, token_timeout_ms=100), on_output=collect)
    engine.add_request("patient", [21, 22, 23], SamplingParams(max_tokens=2, token_timeout_ms=0), on_output=collect)
    collect.wait_finished({"slow", "patient"})
    elapsed = collect.finished_at["slow"] - started
    engine.shutdown(timeout=5)
    print(f"token timeout 100 ms with 300 ms steps fired after {elapsed * 1e3:.0f} ms")
    assert collect.final("slow").finish_reason == "timeout"
    assert collect.final("slow").new_token_ids == []  # the late token is not delivered
    assert collect.final("patient").finish_reason == "length"
    assert 0.1 <= elapsed < 5.0  # at the end of the first slow step, not after the whole request
    assert metrics.counter(m.REQUESTS_TIMED_OUT) == 1 and engine.stats().blocks_used == 0


def test_engine_default_timeout_applies_to_queued_requests() -> None:
    cfg = config(default_token_timeout_ms=150, max_num_seqs=1)
    engine = LLMEngine(cfg, runner=SlowFakeRunner.for_config(cfg, sleep_s=0.02), metrics=InMemoryMetrics())
    engine.start()
    collect = Collector()
    engine.add_request("first", [11, 12], SamplingParams(max_tokens=40, token_timeout_ms=0), on_output=collect)
    engine.add_request("queued", [13, 14], SamplingParams(max_tokens=2), on_output=collect)
    collect.wait_finished({"queued"})
    assert collect.final("queued").finish_reason == "timeout"
    assert not engine.scheduler.requests.get("queued")
    engine.abort("first")
    collect.wait_finished({"first"})
    engine.shutdown(timeout=5)


def test_step_failure_ends_in_flight_requests_and_rejects_new_ones() -> None:
    cfg = config()
    dead = []
    engine = LLMEngine(cfg, runner=FakeRunner.for_config(cfg, fail_at_step=4), on_dead=dead.append)
    collect = Collector()
    for i in range(5):
        engine.add_request(f"r{i}", [10 + i, 20, 30], SamplingParams(max_tokens=30), on_output=collect)
    engine.start()
    collect.wait_finished({f"r{i}" for i in range(5)})
    for i in range(5):
        final = collect.final(f"r{i}")
        assert final.finish_reason == "error"
        assert final.error == "engine failed: RuntimeError: fake runner failure"
    deadline = time.monotonic() + WAIT_S
    while engine.is_healthy() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not engine.is_healthy() and len(dead) == 1 and isinstance(dead[0], RuntimeError)
    with pytest.raises(EngineDeadError, match="engine failed: RuntimeError"):
        engine.add_request("late", [1, 2], SamplingParams())
    assert not engine.abort("r0")
    assert engine.stats().blocks_used == 0
    engine.shutdown(timeout=5)


def test_shutdown_ends_live_requests_and_idle_loop_sleeps() -> None:
    cfg = config()
    runner = SlowFakeRunner.for_config(cfg, sleep_s=0.01)
    engine = LLMEngine(cfg, runner=runner)
    engine.start()
    time.sleep(0.2)
    assert runner.steps == 0  # idle: no steps, no spin
    collect = Collector()
    engine.add_request("long", [11, 12], SamplingParams(max_tokens=300), on_output=collect)
    time.sleep(0.1)
    engine.shutdown(timeout=5)
    collect.wait_finished({"long"})
    assert collect.final("long").finish_reason == "error" and collect.final("long").error == "engine shut down"
    assert not engine._thread.is_alive()  # type: ignore[union-attr]
    with pytest.raises(EngineDeadError, match="^engine shut down$"):
        engine.add_request("after", [1], SamplingParams())


def test_launch_builds_the_runner_on_the_loop_thread_and_serves() -> None:
    """One thread builds the model and runs the loop (one OpenMP team per
    process); what building raises reaches the caller."""
    cfg = config()
    built_on: list[str] = []

    def make_runner() -> FakeRunner:
        built_on.append(threading.current_thread().name)
        return FakeRunner.for_config(cfg)

    engine = launch(cfg, make_runner=make_runner)
    try:
        assert built_on == ["llm-engine-loop"] and engine._thread is not threading.current_thread()
        # the heap built so far is out of the collector's sight while it serves
        assert gc.get_freeze_count() > 0
        collect = Collector()
        engine.add_request("a", [11, 12, 13], SamplingParams(max_tokens=5), on_output=collect)
        collect.wait_finished({"a"})
        assert sum(len(o.new_token_ids) for o in collect.outputs["a"]) == 5
    finally:
        engine.shutdown(timeout=5)
    assert not engine._thread.is_alive()  # type: ignore[union-attr]
    assert gc.get_freeze_count() == 0  # and collectable again once it stops

    def broken() -> FakeRunner:
        raise MemoryError("no room for a single KV block")

    with pytest.raises(MemoryError, match="no room"):
        launch(cfg, make_runner=broken)
