"""Concurrent requests really share forward passes, and batching
does not change greedy output (beyond a logit near-tie)."""

from __future__ import annotations

import pytest
import torch
from tokenizers import Tokenizer

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.engine import LLMEngine
from tests.unit.engine.test_runner_helpers import assert_same_or_near_tie

CHAT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def engine(model_dir) -> LLMEngine:
    return LLMEngine(EngineConfig(model_dir=str(model_dir), max_num_seqs=16))


def test_sixteen_requests_share_forward_passes(engine, model_dir):
    prompt = Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode(CHAT).ids
    greedy = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    alone = engine.generate([(prompt, greedy)])[0]

    rows_per_call: list[int] = []
    hook = engine.runner.model.register_forward_hook(
        lambda module, args, output: rows_per_call.append(int(args[0].shape[0]))
    )
    try:
        together = engine.generate([(prompt, greedy)] * 16)
    finally:
        hook.remove()

    # one forward call prefills all 16 prompts (the prefix cache serves none of
    # it: a prompt's last block is always recomputed, and this prompt is one
    # block long), then each of the 9 decode steps feeds all 16 sequences
    block = engine.config.block_size
    fed = len(prompt) - (len(prompt) - 1) // block * block
    assert rows_per_call == [16 * fed] + [16] * 9, rows_per_call

    def logits_fn(ids):
        with torch.inference_mode():
            from transformers import AutoModelForCausalLM

            hf = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
            return hf(torch.tensor([list(ids)])).logits[0, -1]

    for tokens in together:
        if tokens != alone:
            assert_same_or_near_tie(logits_fn, prompt, alone, tokens)
