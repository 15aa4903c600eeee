"""The runner against Hugging Face transformers on the default model, fp32:
greedy tokens must match `generate(do_sample=False)`; chunked, batched and
prefix-sharing runs must match single runs (or part only at a near-tie)."""

from __future__ import annotations

import pytest
import torch

from python_llm.engine.config import EngineConfig
from python_llm.engine.core.sampling_params import SamplingParams
from python_llm.engine.worker.models.greedy_head import GreedyHeads
from python_llm.engine.worker.runner import ModelRunner
from tests.unit.engine.test_runner_helpers import RunnerDriver, assert_same_or_near_tie

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in one sentence.",
    "List three prime numbers.",
    "Who wrote Romeo and Juliet?",
    "Translate 'good morning' into Spanish.",
    "What is 12 times 12?",
    "Give me a tip for learning to code.",
]
NEW_TOKENS = 32
# the derived checks (chunked, batched, shared prefix) compare a shorter
# prefix of the single runs: enough steps to cover decode, cheaper on 2 cores
SHORT = 12
# HF's min_new_tokens masks EOS the same way; comparing all 32 tokens also
# exercises min_tokens through the runner
GREEDY_NO_EOS = SamplingParams(temperature=0.0, min_tokens=NEW_TOKENS, stop_token_ids=[2])


@pytest.fixture(scope="module")
def tokenizer(model_dir):  # model_dir: the session fixture of tests/conftest.py
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def prompts(tokenizer) -> list[list[int]]:
    result = []
    for text in PROMPTS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True
        )
        result.append(list(ids["input_ids"] if hasattr(ids, "keys") else ids))
    return result


@pytest.fixture(scope="module")
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(2)
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()


@pytest.fixture(scope="module")
def runner(model_dir) -> ModelRunner:
    return ModelRunner(EngineConfig(model_dir=str(model_dir), num_threads=2, max_tokens_in_paged_kv_cache=8192))


@pytest.fixture(scope="module")
def hf_logits(hf_model):
    @torch.inference_mode()
    def fn(ids):
        return hf_model(torch.tensor([list(ids)])).logits[0, -1]

    return fn


@pytest.fixture(scope="module")
def single_runs(runner: ModelRunner, prompts: list[list[int]]) -> list[list[int]]:
    outputs = []
    for i, prompt in enumerate(prompts):
        driver = RunnerDriver(runner)
        driver.add(f"single-{i}", prompt, NEW_TOKENS, GREEDY_NO_EOS)
        outputs.append(driver.run()[f"single-{i}"])
    return outputs


def test_greedy_matches_hf_generate(hf_model, prompts, single_runs) -> None:
    with torch.inference_mode():
        for prompt, ours in zip(prompts, single_runs):
            expected = hf_model.generate(
                torch.tensor([prompt]),
                attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                max_new_tokens=NEW_TOKENS,
                min_new_tokens=NEW_TOKENS,
                do_sample=False,
                pad_token_id=2,
            )[0, len(prompt) :].tolist()
            assert ours == expected


@torch.inference_mode()
def hf_greedy_tokens(hf_model, prompt: list[int], n: int) -> list[int]:
    """HF's own forward and KV cache, argmax at every step: what
    `generate(do_sample=False)` computes, without its EOS stopping (a plain
    greedy request runs through an EOS here, as the runner does)."""
    ids, cache, tokens = torch.tensor([prompt]), None, []
    for _ in range(n):
        out = hf_model(input_ids=ids, cache=cache, use_cache=True)
        cache = out.cache
        tokens.append(int(out.logits[0, -1].argmax()))
        ids = torch.tensor([[tokens[-1]]])
    return tokens


@pytest.mark.parametrize("head", ["fp32 fused", "bf16", "int16"])
def test_fused_greedy_matches_hf(runner, hf_model, prompts, monkeypatch, head: str) -> None:
    """Plain greedy requests (no EOS ban, no log-probs) get their tokens from
    the model's greedy path, every way it has: the fused fp32 LM-head +
    argmax kernel, which sums each logit in another order than MKL's GEMM,
    and the bf16 or int16 LM head with the exact argmax over its candidates
    (`auto` takes bf16 on CPUs with bf16 dot products, int16 on other AVX2
    CPUs; both checked here on any CPU). Each way token-identical to HF,
    run alone."""
    assert runner.kernels is not None, "the native kernels did not build here"
    calls = []
    if head == "fp32 fused":
        fused = runner.kernels.lm_head_argmax
        monkeypatch.setattr(runner.model, "greedy_head", None)
        monkeypatch.setattr(runner.kernels, "lm_head_argmax", lambda *a: calls.append(1) or fused(*a))
    else:
        verified = GreedyHeads[head](runner.model.lm_head, runner.kernels)
        monkeypatch.setattr(runner.model, "greedy_head", lambda normed: calls.append(1) or verified(normed))
    for i, prompt in enumerate(prompts):
        driver = RunnerDriver(runner)
        driver.add(f"fused-{i}", prompt, NEW_TOKENS, SamplingParams(temperature=0.0))
        assert driver.run()[f"fused-{i}"] == hf_greedy_tokens(hf_model, prompt, NEW_TOKENS), f"prompt {i}"
    assert len(calls) == len(prompts) * NEW_TOKENS


def test_greedy_rows_beside_sampled_rows_keep_the_greedy_head(runner, hf_model, prompts, monkeypatch) -> None:
    """In a step where some rows sample (temperature, log-probs), the plain
    greedy rows still take the model's greedy LM head and only the others'
    logits are computed, so a greedy request's tokens do not depend on its
    batch (HF's, token for token), and a seeded sampled request draws what
    it draws alone."""
    assert runner.kernels is not None, "the native kernels did not build here"
    greedy_rows, logit_rows = [], []
    greedy_tokens, compute_logits = runner.model.greedy_tokens, runner.model.compute_logits
    monkeypatch.setattr(runner.model, "greedy_tokens", lambda h: greedy_rows.append(h.shape[0]) or greedy_tokens(h))
    monkeypatch.setattr(runner.model, "compute_logits", lambda h: logit_rows.append(h.shape[0]) or compute_logits(h))
    sampled = SamplingParams(temperature=0.8, top_k=50, seed=7, return_log_probs=True)
    alone = RunnerDriver(runner)
    alone.add("sampled", prompts[1], SHORT, sampled)
    expected_sampled = alone.run()["sampled"]
    greedy_rows.clear(), logit_rows.clear()
    results = []
    execute = runner.execute
    monkeypatch.setattr(runner, "execute", lambda scheduled: results.append(execute(scheduled)) or results[-1])
    mixed = RunnerDriver(runner)
    mixed.add("greedy-0", prompts[0], SHORT, SamplingParams(temperature=0.0))
    mixed.add("sampled", prompts[1], SHORT, sampled)
    mixed.add("greedy-2", prompts[2], SHORT, SamplingParams(temperature=0.0))
    outputs = mixed.run()
    assert outputs["sampled"] == expected_sampled
    for name, prompt in (("greedy-0", prompts[0]), ("greedy-2", prompts[2])):
        assert outputs[name] == hf_greedy_tokens(hf_model, prompt, SHORT), name
    assert greedy_rows == [2] * SHORT and logit_rows == [1] * SHORT
    # the sampled row's log-prob, in its place in the batch; none for the greedy rows
    stepped = [r for r in results if r.token_ids]
    assert len(stepped) == SHORT
    for r in stepped:
        assert r.logprobs is not None and r.logprobs[0] is None and r.logprobs[2] is None
        assert isinstance(r.logprobs[1], float) and r.logprobs[1] <= 0.0


def test_chunked_prefill_gives_same_tokens(runner, prompts, single_runs, hf_logits) -> None:
    prompt = prompts[4]
    driver = RunnerDriver(runner, chunk=-(-len(prompt) // 3))
    driver.add("chunked", prompt, SHORT, GREEDY_NO_EOS)
    ours = driver.run()["chunked"]
    assert sum(1 for s in driver.steps if s and not s[0][3]) == 2  # 3 chunks
    assert_same_or_near_tie(hf_logits, prompt, single_runs[4][:SHORT], ours)


def test_mixed_batch_matches_single_runs(runner, prompts, single_runs, hf_logits) -> None:
    driver = RunnerDriver(runner, chunk=20)
    for i, prompt in enumerate(prompts):
        driver.add(f"batch-{i}", prompt, SHORT, GREEDY_NO_EOS, arrive_step=i // 2)
    outputs = driver.run()
    mixed = [s for s in driver.steps if any(q[2] == 1 for q in s) and any(q[2] > 1 for q in s)]
    assert mixed, "the driver never mixed decodes with prefill chunks"
    assert max(len(s) for s in driver.steps) == len(prompts)
    for i, prompt in enumerate(prompts):
        assert_same_or_near_tie(hf_logits, prompt, single_runs[i][:SHORT], outputs[f"batch-{i}"])


def test_shared_prefix_blocks(runner, prompts, single_runs, hf_logits) -> None:
    """B's block table starts with A's blocks (a prefix-cache hit): B only
    prefills from the first unshared position and still decodes correctly."""
    bs = runner.block_size
    base = prompts[0]
    shared_len = (len(base) // bs) * bs
    assert shared_len >= bs
    driver = RunnerDriver(runner)
    a = driver.add("owner", base, 1, GREEDY_NO_EOS)  # its prefill writes the shared blocks
    driver.run()
    shared_blocks = a.block_table[: shared_len // bs]
    own_blocks = driver.blocks_for(len(base) + SHORT - shared_len + bs)
    second = RunnerDriver(runner)
    second.next_block = driver.next_block + len(own_blocks)
    second.add("reuser", base, SHORT, GREEDY_NO_EOS, block_table=shared_blocks + own_blocks, start_position=shared_len)
    # a concurrent request with its own blocks keeps the step batched
    second.add("neighbour", prompts[3], SHORT, GREEDY_NO_EOS)
    outputs = second.run()
    assert second.steps[0][0][1] == shared_len
    assert_same_or_near_tie(hf_logits, base, single_runs[0][:SHORT], outputs["reuser"])
    assert_same_or_near_tie(hf_logits, prompts[3], single_runs[3][:SHORT], outputs["neighbour"])
