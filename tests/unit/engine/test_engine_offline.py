"""LLMEngine driven by step() / generate() on the test's thread."""

from __future__ import annotations

import time

import pytest

from contract import metric_names as m
from python_llm.engine.config import EngineConfig
from python_llm.engine.core.errors import DuplicateRequestError, EngineDeadError, InvalidRequestError, OverloadedError
from python_llm.engine.core.metrics import InMemoryMetrics
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.engine import LLMEngine
from tests.unit.engine.engine_fakes import FakeRunner, expected_tokens


def make_engine(runner_kwargs: dict | None = None, **cfg: object) -> tuple[LLMEngine, FakeRunner, InMemoryMetrics]:
    config = EngineConfig(model_dir="unused", block_size=4, max_tokens_in_paged_kv_cache=4 * 64, **cfg)  # type: ignore[arg-type]
    runner = FakeRunner.for_config(config, **(runner_kwargs or {}))
    metrics = InMemoryMetrics()
    return LLMEngine(config, runner=runner, metrics=metrics), runner, metrics


def prompt(n: int, base: int = 100) -> list[int]:
    return [base + i for i in range(n)]


def test_generate_returns_each_requests_tokens() -> None:
    engine, _, metrics = make_engine()
    results = engine.generate_results(
        [
            (prompt(5), SamplingParams(max_tokens=3)),
            (prompt(9, 300), SamplingParams(max_tokens=6, return_log_probs=True)),
        ]
    )
    assert [r.token_ids for r in results] == [expected_tokens("generate-1", 3), expected_tokens("generate-2", 6)]
    assert [r.finish_reason for r in results] == ["length", "length"]
    assert results[1].logprobs == [-0.5] * 6 and results[1].cum_log_prob == pytest.approx(-3.0)
    assert results[0].logprobs is None
    first = results[0]
    assert first.arrival_time_ns <= first.first_token_time_ns <= first.last_token_time_ns  # type: ignore[operator]
    assert metrics.counter(m.GENERATION_TOKENS) == 9 and metrics.counter(m.PROMPT_TOKENS) == 14
    assert len(metrics.observations(m.TIME_TO_FIRST_TOKEN)) == 2
    assert len(metrics.observations(m.INTER_TOKEN_LATENCY)) == 2 + 5
    assert len(metrics.observations(m.TIME_PER_OUTPUT_TOKEN)) == 2
    assert metrics.gauge(m.KV_BLOCKS_USED) == 0 and metrics.gauge(m.KV_BLOCKS_CAPACITY) == 64
    assert engine.stats().blocks_free == 64


def test_overload_is_rejected_at_once() -> None:
    engine, _, metrics = make_engine(max_queue_size=2)
    engine.add_request("a", prompt(4), SamplingParams())
    engine.add_request("b", prompt(4), SamplingParams())
    started = time.perf_counter()
    with pytest.raises(OverloadedError) as info:
        engine.add_request("c", prompt(4), SamplingParams())
    assert time.perf_counter() - started < 0.05
    assert str(info.value).startswith("overloaded:")
    assert metrics.counter(m.REQUESTS_REJECTED) == 1
    engine.step()  # both admitted: the queue has room again
    engine.add_request("c", prompt(4), SamplingParams())


def test_duplicate_live_id_is_rejected_until_it_finishes() -> None:
    engine, _, _ = make_engine()
    engine.add_request("x", prompt(4), SamplingParams(max_tokens=2))
    with pytest.raises(DuplicateRequestError, match="^request id: 'x' is already running$"):
        engine.add_request("x", prompt(4), SamplingParams(max_tokens=2))
    while engine.num_live_requests():
        engine.step()
    engine.add_request("x", prompt(4), SamplingParams(max_tokens=2))


@pytest.mark.parametrize(
    "tokens, params, field",
    [
        ([], SamplingParams(), "input_ids:"),
        (prompt(2040), SamplingParams(max_tokens=4), "input_ids:"),
        ([5, 1000], SamplingParams(), "input_ids:"),
        (prompt(100), SamplingParams(max_tokens=200), "max_tokens:"),
        (prompt(4), SamplingParams(max_tokens=0), "max_tokens:"),
        (prompt(4), SamplingParams(temperature=-1), "temperature:"),
        (prompt(4), SamplingParams(stop_words_ids=[[1, -3]]), "stop_words_ids:"),
    ],
)
def test_invalid_requests_name_the_field(tokens: list[int], params: SamplingParams, field: str) -> None:
    engine, _, _ = make_engine(max_model_len=2048)
    with pytest.raises(InvalidRequestError) as info:
        engine.add_request("bad", tokens, params)
    assert str(info.value).startswith(field)
    assert engine.num_live_requests() == 0


def test_max_tokens_beyond_the_engines_limit_is_refused_naming_it() -> None:
    engine, _, _ = make_engine(max_tokens_limit=100)
    with pytest.raises(InvalidRequestError, match=r"^max_tokens: must be <= 100, got 101$"):
        engine.add_request("big", prompt(4), SamplingParams(max_tokens=101))
    engine.add_request("ok", prompt(4), SamplingParams(max_tokens=100))


def test_max_tokens_left_to_the_engine_is_its_default_max_tokens() -> None:
    assert SamplingParams().max_tokens is None
    engine, _, _ = make_engine(default_max_tokens=5)
    default, explicit = engine.generate_results(
        [(prompt(4), SamplingParams()), (prompt(4, 300), SamplingParams(max_tokens=3))]
    )
    assert (len(default.token_ids), default.finish_reason) == (5, "length")
    assert (len(explicit.token_ids), explicit.finish_reason) == (3, "length")
    # the default is held to the same engine limits as an explicit value
    short = make_engine(default_max_tokens=300)[0]
    with pytest.raises(InvalidRequestError, match=r"^max_tokens: prompt \+ max_tokens \(304 tokens\) exceeds the KV"):
        short.add_request("long", prompt(4), SamplingParams())


def test_abort_frees_blocks_and_reports_cancelled() -> None:
    engine, _, metrics = make_engine()
    seen = []
    engine.add_request("a", prompt(30), SamplingParams(max_tokens=100), on_output=seen.append)
    engine.add_request("b", prompt(30, 500), SamplingParams(max_tokens=100))
    for _ in range(3):
        engine.step()
    assert engine.stats().blocks_used > 0
    assert engine.abort("a") and engine.abort("b")
    assert not engine.abort("nobody")
    outs = engine.step()
    assert sorted((o.request_id, o.finish_reason) for o in outs) == [("a", "cancelled"), ("b", "cancelled")]
    assert seen[-1].finished and seen[-1].finish_reason == "cancelled" and len(seen) == 4
    assert engine.stats().blocks_used == 0 and engine.num_live_requests() == 0
    assert metrics.counter(m.REQUESTS_CANCELLED) == 2
    assert not engine.abort("a")


def test_stop_token_ids_none_means_the_models_eos_and_empty_means_none() -> None:
    engine, runner, _ = make_engine()
    runner.token_fn = lambda rid, i: [11, 2, 12][i]  # 2: the fake model's EOS
    default, explicit_none = engine.generate_results(
        [(prompt(4), SamplingParams(max_tokens=3)), (prompt(4), SamplingParams(max_tokens=3, stop_token_ids=[]))]
    )
    assert (default.token_ids, default.finish_reason) == ([11], "stop")
    assert (explicit_none.token_ids, explicit_none.finish_reason) == ([11, 2, 12], "length")


def test_stats_count_preemptions_and_prefix_cache_hits_as_the_metrics_do() -> None:
    """Six blocks of four tokens; two requests that each need four (4 prompt +
    11 fed outputs). At position 12 both need a fourth block: the later one
    is preempted, once. It comes back when the first finishes and finds two
    of its three full blocks cached (its tail block was freed first, so the
    first request's fourth block took it): 8 prompt tokens from the cache."""
    config = EngineConfig(model_dir="unused", block_size=4, max_tokens_in_paged_kv_cache=24)
    metrics = InMemoryMetrics()
    engine = LLMEngine(config, runner=FakeRunner.for_config(config), metrics=metrics)
    assert (engine.stats().preemptions, engine.stats().prefix_cache_hit_tokens) == (0, 0)
    results = engine.generate_results(
        [(prompt(4), SamplingParams(max_tokens=12)), (prompt(4, 200), SamplingParams(max_tokens=12))]
    )
    assert [r.token_ids for r in results] == [expected_tokens("generate-1", 12), expected_tokens("generate-2", 12)]
    stats = engine.stats()
    assert (stats.preemptions, stats.prefix_cache_hit_tokens) == (1, 8)
    assert (metrics.counter(m.PREEMPTIONS), metrics.counter(m.PREFIX_CACHE_HIT_TOKENS)) == (1, 8)


def test_failing_callback_ends_only_its_request() -> None:
    engine, _, _ = make_engine()

    def broken(out: object) -> None:
        raise ValueError("client went away")

    good = []
    engine.add_request("bad", prompt(4), SamplingParams(max_tokens=5), on_output=broken)
    engine.add_request("good", prompt(4, 700), SamplingParams(max_tokens=5), on_output=good.append)
    outs = engine.step()
    [ended] = [o for o in outs if o.request_id == "bad" and o.finished]
    assert ended.finish_reason == "error" and "client went away" in (ended.error or "")
    while engine.num_live_requests():
        engine.step()
    assert good[-1].finish_reason == "length" and sum(len(o.new_token_ids) for o in good) == 5
    assert engine.is_healthy()


def test_step_failure_kills_the_engine_offline() -> None:
    dead = []
    config = EngineConfig(model_dir="unused", block_size=4, max_tokens_in_paged_kv_cache=256)
    engine = LLMEngine(config, runner=FakeRunner.for_config(config, fail_at_step=2), on_dead=dead.append)
    with pytest.raises(EngineDeadError, match="engine failed: RuntimeError: fake runner failure"):
        engine.generate([(prompt(4), SamplingParams(max_tokens=5))])
    assert not engine.is_healthy() and len(dead) == 1
    with pytest.raises(EngineDeadError, match="engine failed: RuntimeError: fake runner failure"):
        engine.add_request("late", prompt(4), SamplingParams())
    assert engine.stats().blocks_used == 0


def test_the_configured_test_failure_wraps_the_runner_and_kills_the_engine() -> None:
    """debug_fail_after_steps (what the end-to-end tests set through Triton):
    the runner's steps run until then, and the next one fails."""
    engine, runner, _ = make_engine(debug_fail_after_steps=2)
    assert engine.runner is not runner  # wrapped at construction: the loop has no test-only branch
    with pytest.raises(EngineDeadError, match=r"RuntimeError: injected failure after 2 steps"):
        engine.generate([(prompt(4), SamplingParams(max_tokens=5))])
    assert runner.steps == 2 and engine.stats().blocks_used == 0


def test_64_sequences_prefill_in_one_step_then_decode_together() -> None:
    """The shape `make bench` times the engine's per-step overhead on (its
    speed goal lives there, bench/engine_offline.py): 64 prompts of 32 tokens
    fill one 2048-token step, then 99 steps decode all 64 at once."""
    config = EngineConfig(
        model_dir="unused",
        block_size=16,
        max_tokens_in_paged_kv_cache=16 * 1024,
        max_num_seqs=64,
        max_num_batched_tokens=2048,
    )
    runner = FakeRunner.for_config(config, check_kv=False)
    engine = LLMEngine(config, runner=runner, metrics=InMemoryMetrics())
    for i in range(64):
        engine.add_request(f"r{i}", prompt(32, 14 * i), SamplingParams(max_tokens=100, ignore_eos=True))
    while engine.num_live_requests():
        engine.step()
    assert runner.batch_sizes == [64] * 100
    assert runner.num_batched_tokens == [2048] + [64] * 99
