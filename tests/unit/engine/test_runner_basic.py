"""Runner behaviour on a tiny random model: KV budget, per-request RNG state,
input validation, step shapes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.core.scheduler_output import LayerSlice
from python_llm.engine.worker.input_batch import CachedRequestState
from python_llm.engine.worker.runner import ModelRunner, SchedulingError
from tests.unit.engine.seam_messages import new_request, prefill, step
from tests.unit.engine.test_model_tiny import save_tiny
from tests.unit.engine.test_runner_helpers import RunnerDriver


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> ModelRunner:
    folder = save_tiny(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    return ModelRunner(
        EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=2048, block_size=8, num_threads=2)
    )


def test_kv_budget_on_cpu(runner: ModelRunner) -> None:
    assert runner.num_blocks == 2048 // 8
    assert runner.kv_cache.keys[0].shape == (2, 256, 8, 16)
    assert runner.model_info.vocab_size == 96


def test_partial_chunk_samples_nothing(runner: ModelRunner) -> None:
    out = runner.execute(prefill("p", list(range(3, 14)), [0, 1], num_tokens=10))
    assert out.token_ids == [] and out.logprobs is None
    assert out.model_seconds > 0
    runner.execute(step(finished=["p"]))


def test_empty_step(runner: ModelRunner) -> None:
    assert runner.execute(step()).token_ids == []


def test_logprobs_returned_when_asked(runner: ModelRunner) -> None:
    out = runner.execute(
        step(
            new=[(new_request("a", [5, 6, 7], [0], return_log_probs=True), 3), (new_request("b", [5, 6, 7], [1]), 3)],
            finished=[],
        )
    )
    runner.execute(step(finished=["a", "b"]))
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
        runner.execute(step(finished=[r.request_id for r in driver.requests]))
        return tokens

    first = generate("s1", 0)
    assert "s1" not in runner.input_batch._generators and "s1" not in runner.input_batch.requests
    assert generate("s2", 3) == first
    assert len(set(first)) > 1


def test_single_token_chunk_after_prefill_matches_decode_path(runner: ModelRunner) -> None:
    """A 1-token sequence that is not in the leading decode run takes the
    prefill path; both must give the same token."""
    prompt = [11, 12, 13, 14, 15, 16, 17, 18, 19]
    runner.execute(
        step(
            new=[
                (new_request("x1", prompt, [10, 11]), 8),
                (new_request("x2", prompt, [13, 14]), 8),
                (new_request("y", [3, 4, 5, 6], [12]), 2),
            ]
        )
    )
    as_decode = runner.execute(step(cached=[("x1", 8, 1, None)])).token_ids[0]
    as_prefill = runner.execute(step(cached=[("y", 2, 2, None), ("x2", 8, 1, None)])).token_ids[1]
    assert as_decode == as_prefill
    runner.execute(step(finished=["x1", "x2", "y"]))


@pytest.mark.parametrize(
    "bad, match",
    [
        (dict(tokens=[1, 2, 3], n=3, table=[]), "blocks cannot hold"),
        (dict(tokens=[1], n=0, table=[0]), "no tokens"),
        (dict(tokens=list(range(300)), n=44, table=list(range(40)), computed=256), "outside"),
        (dict(tokens=[1, 2], n=3, table=[0]), "tokens known"),
    ],
)
def test_invalid_schedules_are_rejected(runner: ModelRunner, bad: dict, match: str) -> None:
    request = new_request("bad", bad["tokens"], bad["table"], computed=bad.get("computed", 0))
    with pytest.raises(SchedulingError, match=match):
        runner.execute(step(new=[(request, bad["n"])]))
    runner.execute(step(finished=["bad"]))


def test_a_request_the_runner_never_saw_is_rejected(runner: ModelRunner) -> None:
    with pytest.raises(SchedulingError, match="never saw it"):
        runner.execute(step(cached=[("ghost", 3, 1, None)]))


def test_min_tokens_leaves_the_fused_greedy_path_only_before_it_is_reached(
    runner: ModelRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stop-token ban of `min_tokens` rewrites the logits while fewer than
    min_tokens are generated; from then on the step is plain greedy again and
    its token comes from the model's greedy path (LM head + argmax, no
    logits for the sampler)."""
    assert runner.kernels is not None, "the native kernels did not build here"
    greedy = runner.model.greedy_tokens
    calls: list[int] = []
    monkeypatch.setattr(runner.model, "greedy_tokens", lambda *a: calls.append(1) or greedy(*a))
    driver = RunnerDriver(runner)
    driver.add("min", [4, 5, 6, 7], 8, SamplingParams(temperature=0.0, min_tokens=3, stop_token_ids=[2]))
    tokens = driver.run()["min"]
    assert 2 not in tokens[:3]
    assert len(calls) == 8 - 3  # the steps that sample tokens 3 .. 7


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
def test_decodes_of_different_lengths_match_single_runs(tmp_path_factory: pytest.TempPathFactory, backend: str) -> None:
    """PyTorch path: decodes are re-laid out by context length into several
    padded groups. Native kernel (auto on the CPU): one ragged batch. Either
    way each sequence's token must equal its token when decoded alone, and
    the output keeps the input order."""
    folder = save_tiny(tmp_path_factory.mktemp("tiny") / "llama", "llama")
    runner = ModelRunner(
        EngineConfig(
            model_dir=str(folder),
            max_tokens_in_paged_kv_cache=2048,
            block_size=8,
            num_threads=2,
            attention_backend=backend,
        )
    )
    lengths = [100, 3, 40, 9, 100, 12]
    ids = [f"g{i}" for i in range(len(lengths))]
    for copy in ("alone", "together"):  # the same requests twice: decoded alone, then in one batch
        for i, length in enumerate(lengths):
            first = 20 * i + (10 if copy == "alone" else 130)
            table = list(range(first, first + 20))
            prompt = [(7 * i + j) % 90 + 3 for j in range(length)]
            runner.execute(
                step(new=[(new_request(f"{copy}-{ids[i]}", prompt, table, return_log_probs=True), length - 1)])
            )
    alone = [runner.execute(step(cached=[(f"alone-{rid}", n - 1, 1, None)])) for rid, n in zip(ids, lengths)]
    states: list[CachedRequestState] = [runner.input_batch.requests[f"together-{rid}"] for rid in ids]
    for st, n in zip(states, lengths):
        st.num_computed_tokens = n - 1
    meta = runner._prepare(states, [1] * len(states)).meta
    if backend == "torch":
        assert meta.decode_batch is None
        assert len(meta.decodes) >= 3 and sum(g.num_seqs for g in meta.decodes) == len(states)
    else:
        assert not meta.decodes and meta.decode_batch is not None
        assert meta.decode_batch.context_lens.tolist() == lengths
    together = runner.execute(step(cached=[(f"together-{rid}", n - 1, 1, None) for rid, n in zip(ids, lengths)]))
    assert together.token_ids == [out.token_ids[0] for out in alone]  # in the input order
    assert together.logprobs == pytest.approx([out.logprobs[0] for out in alone], abs=1e-4)


def sliced_step(out, request_id: str, first: int, end: int):
    out.layer_slice = LayerSlice(request_id, first, end)
    return out


def test_a_chunk_in_layer_slices_gives_what_it_gives_through_all_layers(runner: ModelRunner) -> None:
    """A chunk run one layer a step (its states kept by the runner between
    slices), beside a decode that runs every layer each step, samples what
    the same chunk and decode give unsliced, log-probs included."""
    layers = len(runner.model.layers)
    prompt, other = [7, 3, 9, 4, 1, 8, 6, 5, 3, 2, 9, 7], [4, 4, 5, 6]

    def run(sliced: bool, tag: str) -> tuple[list[int], list[float | None]]:
        a, d = f"a-{tag}", f"d-{tag}"
        blocks = [20, 21] if sliced else [30, 31]
        lp = {"return_log_probs": True}
        first = runner.execute(step(new=[(new_request(d, other, [40 if sliced else 41], **lp), 4)]))
        tokens, logprobs = list(first.token_ids), list(first.logprobs or [])
        new = new_request(a, prompt, blocks, **lp)
        if not sliced:
            out = runner.execute(step(new=[(new, 12)], cached=[(d, 4, 1, None)]))
            tokens += out.token_ids
            logprobs += out.logprobs or []
        else:
            for layer in range(layers):
                message = (
                    step(new=[(new, 12)], cached=[(d, 4 + layer, 1, None)])
                    if layer == 0
                    else step(cached=[(d, 4 + layer, 1, None), (a, 0, 12, None)])
                )
                out = runner.execute(sliced_step(message, a, layer, layer + 1))
                tokens += out.token_ids
                logprobs += out.logprobs or []
                # the decode samples every step; the chunk only after its last layer
                assert len(out.token_ids) == (2 if layer == layers - 1 else 1)
                assert out.slice_seconds is None or out.slice_seconds >= 0
        runner.execute(step(finished=[a, d]))
        assert a not in runner._slice_hidden
        return tokens, logprobs

    unsliced_tokens, unsliced_lps = run(False, "full")
    sliced_tokens, sliced_lps = run(True, "sliced")
    # the decode's tokens for its first steps and the chunk's first token
    assert sliced_tokens[-1] == unsliced_tokens[-1]
    assert sliced_lps[-1] == pytest.approx(unsliced_lps[-1], abs=1e-5)
    assert sliced_tokens[:2] == unsliced_tokens[:2]


def test_a_slice_of_a_chunk_the_runner_did_not_start_is_refused(runner: ModelRunner) -> None:
    runner.execute(prefill("z", [5, 6, 7, 8], [50], num_tokens=2))
    with pytest.raises(SchedulingError, match="did not start"):
        runner.execute(sliced_step(step(cached=[("z", 2, 2, None)]), "z", 1, 2))
    with pytest.raises(SchedulingError, match="not in the step"):
        runner.execute(sliced_step(step(cached=[("z", 2, 2, None)]), "other", 0, 1))
    runner.execute(step(finished=["z"]))
