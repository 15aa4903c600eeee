"""bench.output_agreement: identical outputs, near-ties and real mismatches,
judged with fakes of the three views (this engine, vLLM, HF)."""

from __future__ import annotations

from bench.output_agreement import NEAR_TIE_NATS, compare_outputs


class FakeEngine:
    def logprobs_at(self, context, candidates, request_id):
        return {"logprobs": [-1.0, -1.5], "token": candidates[0]}


class FakeVllm:
    def __init__(self) -> None:
        self.asked: list[dict] = []

    def command(self, cmd, items):
        assert cmd == "logprobs"
        self.asked.extend(items)
        return {"items": [{"logprobs": [-1.5, -1.0], "token": item["candidates"][1]} for item in items]}


class FakeReference:
    """HF's log-probs of the two candidates: a near-tie after token 7, a clear winner after 8."""

    def logprobs_at(self, context, candidates):
        return [-1.0, -1.0 - NEAR_TIE_NATS / 10] if context[-1] == 7 else [-0.1, -4.0]


def test_identical_outputs_ask_no_view() -> None:
    agreement = compare_outputs([[1, 2], [3]], [[1, 2], [3]], [[0], [0]], None, None, None)
    assert (agreement.identical, agreement.near_ties, agreement.mismatches) == (2, 0, 0)
    assert "2/2 identical" in agreement.line()


def test_a_near_tie_and_a_real_mismatch_are_told_apart() -> None:
    vllm = FakeVllm()
    ours = [[7, 10, 11], [8, 20], [5]]
    theirs = [[7, 12, 11], [8, 21], [5]]
    agreement = compare_outputs(ours, theirs, [[1], [2], [3]], FakeEngine(), vllm, FakeReference())
    assert (agreement.identical, agreement.near_ties, agreement.mismatches) == (1, 1, 1)
    # each divergence is judged in its own context: the prompt and the tokens before it
    assert [item["context"] for item in vllm.asked] == [[1, 7], [2, 8]]
    assert [d["near_tie"] for d in agreement.divergences] == [True, False]
    assert agreement.divergences[1]["position"] == 1 and agreement.divergences[1]["vllm_token"] == 21
    assert "1 real mismatches" in agreement.line()
