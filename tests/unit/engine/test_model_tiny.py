"""Tiny random Llama-family models (built with transformers, saved as HF
folders) run through the runner must match HF's logits: covers Qwen2's qkv
bias, llama3 rope scaling, Mistral, untied LM heads and sharded weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_llm.engine.config import EngineConfig
from python_llm.engine.worker.runner import ModelRunner
from tests.unit.engine.seam_messages import state

COMMON = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    eos_token_id=2,
)


def save_tiny(folder: Path, kind: str, **overrides) -> Path:
    import transformers

    torch.manual_seed(0)
    config_cls, model_cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    config = config_cls(**{**COMMON, **overrides})
    model = model_cls(config).eval()
    with torch.no_grad():  # random biases, so a dropped bias would show
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.normal_(0.0 if name.endswith("bias") else 1.0, 0.1)
    model.save_pretrained(folder, max_shard_size="100KB" if kind == "mistral" else "1GB")
    return folder


def runner_logits(runner: ModelRunner, ids: list[int]) -> torch.Tensor:
    """All positions' logits from one prefill through the runner's model."""
    probe = state("probe", ids, list(range(-(-len(ids) // runner.block_size))))
    batch = runner._prepare([probe], [len(ids)])
    with torch.inference_mode():
        hidden = runner.model(batch.input_ids, batch.positions, batch.meta, runner.kv_cache)
        return runner.model.compute_logits(hidden)


CASES = {
    "llama-tied": ("llama", dict(tie_word_embeddings=True)),
    "llama3-rope-untied": (
        "llama",
        dict(
            tie_word_embeddings=False,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            },
        ),
    ),
    "qwen2-bias": ("qwen2", dict(tie_word_embeddings=False)),
    "mistral-sharded": ("mistral", dict(tie_word_embeddings=False, sliding_window=None)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_tiny_model_matches_hf(tmp_path: Path, case: str) -> None:
    import transformers

    kind, overrides = CASES[case]
    folder = save_tiny(tmp_path / case, kind, **overrides)
    if case == "mistral-sharded":
        assert len(list(folder.glob("*.safetensors"))) > 1
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    runner = ModelRunner(EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=1024, num_threads=2))
    ids = torch.randint(3, COMMON["vocab_size"], (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.inference_mode():
        expected = hf(torch.tensor([ids])).logits[0]
    assert torch.allclose(runner_logits(runner, ids), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("backends", [dict(), dict(attention_backend="torch", linear_backend="torch")])
def test_the_last_layer_computes_only_the_rows_that_are_read(tmp_path: Path, backends: dict) -> None:
    """A step's sampled rows come out of a forward with `output_rows` as they
    do out of the full one, and every row's K/V reaches the cache either way
    (none sampled included: a prompt's chunk before its last)."""
    folder = save_tiny(tmp_path / "llama", "llama")
    runner = ModelRunner(
        EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=1024, num_threads=2, **backends)
    )
    ids = torch.randint(3, COMMON["vocab_size"], (40,), generator=torch.Generator().manual_seed(2)).tolist()
    batch = runner._prepare([state("probe", ids, [0, 1, 2])], [len(ids)])
    cache = runner.kv_cache
    # the FMA GEMM's rows do not depend on the rows beside it; oneDNN, AMX
    # and MKL may sum fewer rows in another order
    exact = type(runner.model.layers[-1].projections.o).__name__ == "FmaLinear"
    with torch.inference_mode():
        full = runner.model(batch.input_ids, batch.positions, batch.meta, cache)
        full_keys = [k.clone() for k in cache.keys]
        for rows in ([39], [0, 17, 39], [5, 3], []):
            for k in cache.keys:
                k.zero_()
            pruned = runner.model(
                batch.input_ids, batch.positions, batch.meta, cache, output_rows=torch.tensor(rows, dtype=torch.int64)
            )
            assert pruned.shape == (len(rows), COMMON["hidden_size"])
            if exact:
                assert torch.equal(pruned, full[rows]), rows
            else:
                assert torch.allclose(pruned, full[rows], atol=1e-6, rtol=0), rows
            assert all(torch.equal(k, expected) for k, expected in zip(cache.keys, full_keys))


def test_tiny_model_bfloat16_close_to_fp32(tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "bf16", "llama")
    ids = list(range(5, 35))
    fp32 = runner_logits(ModelRunner(EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=512)), ids)
    bf16 = runner_logits(
        ModelRunner(EngineConfig(model_dir=str(folder), dtype="bfloat16", max_tokens_in_paged_kv_cache=512)), ids
    )
    assert bf16.dtype == torch.float32
    assert (bf16 - fp32).abs().max() < 0.1 * fp32.abs().max()
