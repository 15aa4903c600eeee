"""InputBatch: the runner's persistent per-request state, kept from the
scheduler's messages (a request once, then its changes) and its own samples."""

from __future__ import annotations

import pytest
import torch

from python_llm.engine.worker.input_batch import InputBatch, SchedulingError
from tests.unit.engine.seam_messages import new_request, step


def batch() -> InputBatch:
    return InputBatch(max_blocks_per_seq=4, max_num_seqs=2, device=torch.device("cpu"))


def test_new_once_then_only_changes_and_own_samples() -> None:
    b = batch()
    request = new_request("a", [5, 6, 7], [3], num_prompt_tokens=2)  # 1 token of output so far
    (state,) = b.update(step(new=[(request, 3)]))
    assert state.token_ids == [5, 6, 7] and state.output_token_ids == [7]
    assert state.token_ids is not request.token_ids and state.block_ids == [3]
    b.append_sampled([state], [8])
    (same,) = b.update(step(cached=[("a", 3, 1, (9,))]))
    assert same is state and state.num_computed_tokens == 3 and state.token_ids == [5, 6, 7, 8]
    assert state.block_ids == [3, 9] and b.block_rows.tensor[state.row, :3].tolist() == [3, 9, 0]


def test_preemption_drops_the_row_but_keeps_the_rng_until_the_finish() -> None:
    b = batch()
    (state,) = b.update(step(new=[(new_request("s", [1, 2], [0, 1], temperature=1.0, seed=5), 2)]))
    generator = state.generator
    assert generator is not None
    generator.seed()  # the stream moved on
    b.update(step(preempted=["s"]))
    assert "s" not in b.requests and b.block_rows.num_rows_in_use == 0
    (again,) = b.update(step(new=[(new_request("s", [1, 2, 3], [7], num_prompt_tokens=2, temperature=1.0, seed=5), 3)]))
    assert again.generator is generator and again.block_ids == [7]
    assert b.block_rows.tensor[again.row, :2].tolist() == [7, 0]  # the row rewritten, no stale ids
    b.update(step(finished=["s"]))
    (fresh,) = b.update(step(new=[(new_request("s", [1], [2], temperature=1.0, seed=5), 1)]))
    assert fresh.generator is not generator


def test_messages_the_runner_cannot_follow_are_rejected() -> None:
    b = batch()
    with pytest.raises(SchedulingError, match="never saw it"):
        b.update(step(cached=[("x", 0, 1, None)]))
    b.update(step(new=[(new_request("x", [1], [0]), 1)]))
    with pytest.raises(SchedulingError, match="the runner holds it"):
        b.update(step(new=[(new_request("x", [1], [0]), 1)]))
