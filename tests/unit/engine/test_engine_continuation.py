"""A continuation (output another replica generated before it died) is output
already generated: max_tokens, min_tokens, penalties and stop words see it,
the first prefill covers it, and only what follows it is returned."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.errors import InvalidRequestError
from python_llm.engine.core.metrics import InMemoryMetrics
from python_llm.engine.core.outputs import GenerateResult
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.engine import LLMEngine
from python_llm.engine.worker.input_batch import CachedRequestState
from python_llm.engine.worker.runner import ModelRunner
from python_llm.engine.worker.sampler import Sampler
from python_llm.request_inputs import parse_llm_request
from tests.unit.engine.engine_fakes import EOS, FakeRunner, default_token
from tests.unit.engine.test_model_tiny import COMMON, save_tiny

PROMPT = [100, 101, 102, 103, 104]
CONTINUATION = [50, 51, 52]


def fake_engine(**runner_kwargs: object) -> tuple[LLMEngine, FakeRunner]:
    """`runner.seen`: what each sampled request showed the sampler (prompt, output)."""
    config = EngineConfig(model_dir="unused", block_size=4, max_tokens_in_paged_kv_cache=4 * 64)
    runner = FakeRunner(config.num_cpu_blocks, config.block_size, **runner_kwargs)  # type: ignore[arg-type]
    return LLMEngine(config, runner=runner, metrics=InMemoryMetrics()), runner


def run(
    engine: LLMEngine,
    request_id: str,
    prompt: list[int],
    sampling: SamplingParams,
    continuation: list[int] | None = None,
) -> GenerateResult:
    result = GenerateResult(request_id)
    engine.add_request(request_id, prompt, sampling, continuation_ids=continuation or ())
    while engine.num_live_requests():
        for out in engine.step():
            result.add(out)
    return result


def test_max_tokens_counts_the_continuation_and_only_new_tokens_come_back() -> None:
    engine, runner = fake_engine()
    result = run(engine, "r", PROMPT, SamplingParams(max_tokens=5), CONTINUATION)
    # the fake's token depends on the output index: the continuation fills indexes 0..2
    assert result.token_ids == [default_token("r", 3), default_token("r", 4)]
    assert result.finish_reason == "length"
    assert result.num_prompt_tokens == len(PROMPT)  # usage.prompt_tokens: the original prompt
    # one prefill of prompt + continuation, then a decode
    assert runner.history[0] == [("r", 0, len(PROMPT) + len(CONTINUATION), True)]
    assert runner.seen[0] == (PROMPT, CONTINUATION)  # what the sampler sees: penalties, min_tokens
    assert runner.seen[1] == (PROMPT, CONTINUATION + [default_token("r", 3)])
    assert engine.stats().blocks_used == 0


def test_the_returned_count_is_of_new_tokens() -> None:
    engine, _ = fake_engine()
    outputs = []
    engine.add_request(
        "r", PROMPT, SamplingParams(max_tokens=6), on_output=outputs.append, continuation_ids=CONTINUATION
    )
    while engine.num_live_requests():
        engine.step()
    assert [o.num_output_tokens for o in outputs] == [1, 2, 3]
    assert [len(o.new_token_ids) for o in outputs] == [1, 1, 1]


def test_a_stop_word_spanning_the_switch_stops_at_once() -> None:
    engine, _ = fake_engine()
    first_new = default_token("r", len(CONTINUATION))
    sampling = SamplingParams(max_tokens=20, stop_words_ids=[[CONTINUATION[-1], first_new]])
    result = run(engine, "r", PROMPT, sampling, CONTINUATION)
    assert result.token_ids == [first_new] and result.finish_reason == "stop"


def test_min_tokens_counts_the_continuation() -> None:
    # the fake answers EOS from output index 3 on: the first new token
    eos_late = lambda rid, index: EOS if index >= 3 else default_token(rid, index)  # noqa: E731
    engine, _ = fake_engine(token_fn=eos_late)
    assert run(engine, "met", PROMPT, SamplingParams(max_tokens=9, min_tokens=3), CONTINUATION).token_ids == []
    # min_tokens 5: 3 continuation + 2 new before an EOS ends it (the real
    # sampler bans EOS until then, below; the fake answers it regardless)
    unmet = run(engine, "unmet", PROMPT, SamplingParams(max_tokens=9, min_tokens=5), CONTINUATION)
    assert unmet.token_ids == [EOS, EOS] and unmet.finish_reason == "stop"


def test_the_sampler_bans_and_penalizes_over_the_continuation() -> None:
    sampler = Sampler("cpu")

    def picked(output: list[int], **params: object) -> int:
        logits = torch.zeros(1, 8)
        logits[0, 3], logits[0, 5] = 2.0, 1.0
        sampling = SamplingParams(temperature=0.0, stop_token_ids=[3], **params)  # greedy: 3 unless banned
        state = CachedRequestState("s", [7] + output, 1, sampling, [0])
        return sampler(logits, [state]).token_ids[0]

    assert picked([1, 1], min_tokens=3) == 5  # 2 generated < 3: the stop token is banned
    assert picked([1, 1, 1], min_tokens=3) == 3
    assert picked([3], presence_penalty=1.5) == 5  # a continuation's token is penalized like any output


@pytest.mark.parametrize(
    ("continuation", "max_tokens", "message"),
    [
        ([5, 1000], 8, r"^continuation_ids: token ids must be in \[0, 1000\)$"),
        ([5, -1], 8, r"^continuation_ids: token ids must be in \[0, 1000\)$"),
        ([5, 6, 7], 3, r"^continuation_ids: 3 ids leave nothing to generate within max_tokens 3 "),
        ([5] * 128, None, r"^continuation_ids: 128 ids leave nothing to generate within max_tokens 128 "),
    ],
)
def test_bad_continuations_are_refused_naming_the_field(
    continuation: list[int], max_tokens: int | None, message: str
) -> None:
    engine, _ = fake_engine()
    with pytest.raises(InvalidRequestError, match=message):
        engine.add_request("r", PROMPT, SamplingParams(max_tokens=max_tokens), continuation_ids=continuation)


def test_the_llm_step_splits_input_ids_by_continuation_length() -> None:
    tensors = {
        "input_ids": np.array([PROMPT + CONTINUATION + [0]], dtype=np.int32),
        "input_lengths": np.array([[8]]),
        "continuation_length": np.array([[3]], dtype=np.int32),
    }
    request = parse_llm_request(tensors)
    assert request.prompt_token_ids == PROMPT and request.continuation_ids == CONTINUATION
    assert request.input_ids == PROMPT + CONTINUATION  # what the input echo repeats
    assert parse_llm_request({k: v for k, v in tensors.items() if k != "continuation_length"}).continuation_ids == []
    for bad in (8, 9, -1):
        with pytest.raises(InvalidRequestError, match=rf"^continuation_length: {bad} must be in \[0, 8\)"):
            parse_llm_request({**tensors, "continuation_length": np.array([[bad]], dtype=np.int32)})


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory) -> LLMEngine:
    folder: Path = save_tiny(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    config = EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=1024, block_size=8, num_threads=2)
    runner = ModelRunner(config)
    # the tiny folder has no tokenizer to read the EOS ids from (ignore_eos below anyway)
    runner.model_info.eos_token_ids = [COMMON["eos_token_id"]]
    return LLMEngine(config, runner=runner)


@pytest.mark.parametrize(
    "penalties", [{}, {"presence_penalty": 1.0, "frequency_penalty": 0.5}, {"repetition_penalty": 1.3}]
)
def test_greedy_n_tokens_equal_k_tokens_then_a_continuation_of_the_rest(
    tiny_engine: LLMEngine, penalties: dict
) -> None:
    prompt = list(range(5, 25))
    sampling = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, **penalties)
    whole = run(tiny_engine, "whole", prompt, sampling).token_ids
    assert len(whole) == 16
    for k in (1, 6, 15):
        rest = run(tiny_engine, f"rest-{k}", prompt, sampling, whole[:k])
        assert rest.token_ids == whole[k:], k
        assert rest.num_prompt_tokens == len(prompt)
