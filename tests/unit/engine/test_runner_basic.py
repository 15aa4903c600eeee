"""Runner behaviour on a tiny random model: KV budget, per-request RNG state,
input validation, step shapes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_llm.engine.config import EngineConfig
from python_llm.engine.worker.runner import ModelRunner, SchedulingError
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler_output import ScheduledSequence, SchedulerOutput

from test_model_tiny import save_tiny
from test_runner_helpers import RunnerDriver


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    folder = save_tiny(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    return ModelRunner(EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=2048, block_size=8,
                                    num_threads=2))


def one(request_id: str, tokens: list[int], start: int, table: list[int], sample: bool = True,
        **params) -> ScheduledSequence:
    return ScheduledSequence(request_id, tokens, start, table, sample, SamplingParams(**params))


def test_kv_budget_on_cpu(runner: ModelRunner) -> None:
    assert runner.num_blocks == 2048 // 8
    assert runner.kv_cache.keys[0].shape == (2, 256, 8, 16)
    assert runner.model_info.vocab_size == 96


def test_partial_chunk_samples_nothing(runner: ModelRunner) -> None:
    out = runner.execute(SchedulerOutput([one("p", list(range(3, 13)), 0, [0, 1], sample=False)], 10))
    assert out.token_ids == [] and out.logprobs is None
    assert out.model_seconds > 0


def test_empty_step(runner: ModelRunner) -> None:
    assert runner.execute(SchedulerOutput([], 0)).token_ids == []


def test_logprobs_returned_when_asked(runner: ModelRunner) -> None:
    out = runner.execute(SchedulerOutput([one("a", [5, 6, 7], 0, [0], return_log_probs=True),
                                          one("b", [5, 6, 7], 0, [1])], 6))
    assert out.logprobs is not None and out.logprobs[0] is not None and out.logprobs[0] <= 0
    assert out.logprobs[1] is None
    assert out.token_ids[0] == out.token_ids[1]


def test_seeded_sampling_reproducible_and_state_dropped_when_finished(runner: ModelRunner) -> None:
    def generate(request_id: str, neighbours: int) -> list[int]:
        driver = RunnerDriver(runner)
        driver.add(request_id, [4, 5, 6, 7], 10, SamplingParams(temperature=1.0, seed=77))
        for i in range(neighbours):
            driver.add(f"{request_id}-n{i}", [9, 8, 7], 10, SamplingParams(temperature=1.0))
        tokens = driver.run()[request_id]
        runner.execute(SchedulerOutput([], 0, finished_request_ids=[r.request_id for r in driver.requests]))
        return tokens

    first = generate("s1", 0)
    assert "s1" not in runner._generators
    assert generate("s2", 3) == first
    assert len(set(first)) > 1


def test_single_token_chunk_after_prefill_matches_decode_path(runner: ModelRunner) -> None:
    """A 1-token sequence that is not in the leading decode run takes the
    prefill path; both must give the same token."""
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    runner.execute(SchedulerOutput([one("x", prompt[:-1], 0, [10, 11], sample=False)], 8))
    as_decode = runner.execute(SchedulerOutput([one("x", prompt[-1:], 8, [10, 11])], 1)).token_ids[0]
    as_prefill = runner.execute(SchedulerOutput([one("y", [3, 4, 5], 0, [12]),
                                                 one("x", prompt[-1:], 8, [10, 11])], 4)).token_ids[1]
    assert as_decode == as_prefill


@pytest.mark.parametrize("bad, match", [
    (dict(tokens=[1, 2, 3], start=0, table=[]), "blocks cannot hold"),
    (dict(tokens=[], start=0, table=[0]), "no tokens"),
    (dict(tokens=[1], start=256, table=list(range(40))), "outside"),
])
def test_invalid_schedules_are_rejected(runner: ModelRunner, bad: dict, match: str) -> None:
    with pytest.raises(SchedulingError, match=match):
        runner.execute(SchedulerOutput([one("bad", bad["tokens"], bad["start"], bad["table"])], 1))


def test_min_tokens_leaves_the_fused_greedy_path_only_before_it_is_reached(runner: ModelRunner,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The stop-token ban of `min_tokens` rewrites the logits while fewer than
    min_tokens are generated; from then on the step is plain greedy again and
    its token comes from the fused LM head + argmax."""
    assert runner.kernels is not None, "the native kernels did not build here"
    fused = runner.kernels.lm_head_argmax
    calls: list[int] = []
    monkeypatch.setattr(runner.kernels, "lm_head_argmax", lambda *a: calls.append(1) or fused(*a))
    driver = RunnerDriver(runner)
    driver.add("min", [4, 5, 6, 7], 8, SamplingParams(min_tokens=3, stop_token_ids=[2]))
    tokens = driver.run()["min"]
    assert 2 not in tokens[:3]
    assert len(calls) == 8 - 3          # the steps that sample tokens 3 .. 7


def test_num_threads_applied_only_when_asked(tmp_path: Path) -> None:
    """torch's thread count is process-wide: num_threads=0 leaves it alone."""
    folder = save_tiny(tmp_path / "t", "llama")
    before = torch.get_num_threads()
    try:
        ModelRunner(EngineConfig(model_dir=str(folder), num_threads=1, max_tokens_in_paged_kv_cache=64))
        assert torch.get_num_threads() == 1
        torch.set_num_threads(3)
        ModelRunner(EngineConfig(model_dir=str(folder), num_threads=0, max_tokens_in_paged_kv_cache=64))
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("backend", ["torch", "auto"])
def test_decodes_of_different_lengths_match_single_runs(tmp_path_factory: pytest.TempPathFactory,
                                                        backend: str) -> None:
    """PyTorch path: decodes are re-laid out by context length into several
    padded groups. Native kernel (auto on the CPU): one ragged batch. Either
    way each sequence's token must equal its token when decoded alone, and
    the output keeps the input order."""
    folder = save_tiny(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    runner = ModelRunner(EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=2048, block_size=8,
                                      num_threads=2, attention_backend=backend))
    lengths = [100, 3, 40, 9, 100, 12]
    seqs = []
    for i, length in enumerate(lengths):
        table = list(range(20 * i + 100, 20 * i + 120))
        prompt = [(7 * i + j) % 90 + 3 for j in range(length)]
        runner.execute(SchedulerOutput([one(f"g{i}", prompt[:-1], 0, table, sample=False)], length - 1))
        seqs.append(one(f"g{i}", prompt[-1:], length - 1, table, return_log_probs=True))
    alone = [runner.execute(SchedulerOutput([s], 1)) for s in seqs]
    meta = runner._prepare(seqs).meta
    if backend == "torch":
        assert meta.decode_batch is None
        assert len(meta.decodes) >= 3 and sum(g.num_seqs for g in meta.decodes) == len(seqs)
    else:
        assert not meta.decodes and meta.decode_batch is not None
        assert meta.decode_batch.context_lens.tolist() == lengths
    together = runner.execute(SchedulerOutput(seqs, len(seqs)))
    assert together.token_ids == [out.token_ids[0] for out in alone]   # in the input order
    assert together.logprobs == pytest.approx([out.logprobs[0] for out in alone], abs=1e-4)
