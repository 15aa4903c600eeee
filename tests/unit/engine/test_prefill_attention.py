"""The native prefill-chunk attention kernel (reads the paged cache in
place, causal limit per row, no mask) against the PyTorch path it replaces
(gather + offset mask + SDPA), and the runner sending continued chunks to it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from python_llm.engine.config import EngineConfig
from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels
from python_llm.engine.worker.kernels.reference import prefill_attention_reference
from python_llm.engine.worker.runner import ModelRunner
from tests.unit.engine.seam_messages import state
from tests.unit.engine.test_model_tiny import save_tiny


@pytest.fixture(scope="module")
def native() -> CpuKernels:
    built = cpu_kernels()
    assert built is not None, "the CPU kernels did not build on this machine (see the warning log)"
    if not built.prefill_attention_supported(64):
        pytest.skip("no AVX2 + FMA here: continued chunks take the PyTorch path")
    return built


def chunk_case(
    seed: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tokens: int,
    start: int,
    block_size: int = 16,
    dtype: torch.dtype = torch.float32,
):
    gen = torch.Generator().manual_seed(seed)
    need = -(-(start + tokens) // block_size)
    num_blocks = need + 7
    keys = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=gen).to(dtype)
    values = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=gen).to(dtype)
    table = torch.randperm(num_blocks, generator=gen)[:need].tolist()  # scattered, as a busy pool hands them out
    # q as the model hands it over: a strided view of the fused qkv rows
    query = torch.randn(tokens, heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)[:, :heads]
    return query, keys, values, table


CASES = {  # heads, kv_heads, head_dim
    "gqa3-d64": (9, 3, 64),
    "mha-d64": (4, 4, 64),
    "gqa4-d128": (8, 2, 128),
    "mqa-d64": (4, 1, 64),
}
# (chunk tokens, start): one token, block-aligned or not, a chunk from 0, short and long chunks over a long
# prefix; a chunk of one tile (16 tokens, 32 from a start of 1k) over 1k+ keys has its context split between
# threads and merged; chunks of a few tiles whose query rows do not fill whole row vectors (96-120 tokens past
# 1k of context, 100 before it)
SHAPES = [
    (1, 0),
    (1, 37),
    (5, 16),
    (16, 16),
    (17, 3),
    (40, 0),
    (64, 200),
    (129, 700),
    (8, 1500),
    (13, 2000),
    (16, 3000),
    (1, 4000),
    (33, 2500),
    (24, 3000),
    (32, 1024),
    (20, 1023),
    (96, 1100),
    (100, 1500),
    (112, 2000),
    (120, 1030),
    (100, 300),
]


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("block_size", [16, 8, 32])
def test_matches_the_pytorch_path_fp32(native, case: str, block_size: int) -> None:
    heads, kv_heads, head_dim = CASES[case]
    for i, (tokens, start) in enumerate(SHAPES):
        query, keys, values, table = chunk_case(i, heads, kv_heads, head_dim, tokens, start, block_size)
        scale = head_dim**-0.5
        out = torch.empty(tokens, heads * head_dim)
        native.paged_prefill_attention(out, query, keys, values, torch.tensor(table, dtype=torch.int32), start, scale)
        expected = prefill_attention_reference(query, keys, values, table, start, scale)
        torch.testing.assert_close(out, expected, atol=2e-6, rtol=1e-5, msg=f"{tokens} tokens from {start}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_accumulates_in_fp32(native, dtype: torch.dtype) -> None:
    query, keys, values, table = chunk_case(2, 9, 3, 64, 33, 90, dtype=dtype)
    out = torch.empty(33, 9 * 64, dtype=dtype)
    native.paged_prefill_attention(out, query, keys, values, torch.tensor(table, dtype=torch.int32), 90, 0.125)
    expected = prefill_attention_reference(query, keys, values, table, 90, 0.125)
    torch.testing.assert_close(out.float(), expected, atol=1e-2, rtol=1e-2)


def test_large_score_range_stays_finite(native) -> None:
    """One cached token dominates every score: no overflow, no NaN, and every
    row of the chunk returns that token's value."""
    query, keys, values, table = chunk_case(3, 4, 4, 64, 6, 40)
    q = query[0].reshape(4, 64)
    keys[:, table[1], 3] = q * 50.0  # position 19, before the whole chunk
    query[:] = q.unsqueeze(0)
    out = torch.empty(6, 4 * 64)
    native.paged_prefill_attention(out, query, keys, values, torch.tensor(table, dtype=torch.int32), 40, 1.0)
    assert torch.isfinite(out).all()
    for row in out:
        torch.testing.assert_close(row.reshape(4, 64), values[:, table[1], 3], atol=1e-5, rtol=1e-5)


def test_rejects_bad_arguments(native) -> None:
    query, keys, values, table = chunk_case(4, 9, 3, 64, 20, 30)
    t32 = torch.tensor(table, dtype=torch.int32)
    out = torch.empty(20, 9 * 64)
    with pytest.raises(ValueError, match="block_table"):
        native.paged_prefill_attention(out, query, keys, values, t32.long(), 30, 0.1)
    with pytest.raises(ValueError, match="block_table"):
        native.paged_prefill_attention(out, query, keys, values, t32[:2], 30, 0.1)  # does not cover 50 positions
    with pytest.raises(ValueError, match="outside the cache"):
        native.paged_prefill_attention(out, query, keys, values, t32 + 1000, 30, 0.1)
    with pytest.raises(ValueError, match="out"):
        native.paged_prefill_attention(torch.empty(3, 9 * 64), query, keys, values, t32, 30, 0.1)
    assert not native.prefill_attention_supported(80)
    q80, k80, v80, table80 = chunk_case(5, 2, 1, 80, 4, 4)
    with pytest.raises(ValueError, match="head_dim 80"):
        native.paged_prefill_attention(
            torch.empty(4, 160), q80, k80, v80, torch.tensor(table80, dtype=torch.int32), 4, 0.1
        )


@pytest.mark.parametrize("backend", ["auto", "torch"])
def test_runner_chunked_prefill_matches_hf(tmp_path: Path, backend: str) -> None:
    """A tiny model with head_dim 64 prefilled in chunks of 13: every chunk
    goes to the native kernel on `auto`; on `torch` the first attends to
    itself (SDPA, causal) and the others gather + mask. Every position's
    logits match HF's."""
    import transformers

    folder = save_tiny(tmp_path / "d64", "llama", hidden_size=256, num_attention_heads=4, num_key_value_heads=2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    runner = ModelRunner(
        EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=1024, num_threads=2, attention_backend=backend)
    )
    ids = torch.randint(3, 96, (60,), generator=torch.Generator().manual_seed(1)).tolist()
    table = [9, 2, 30, 4, 17, 1, 22, 8]  # scattered blocks of 16
    logits, native_chunks = [], 0
    with torch.inference_mode():
        for start in range(0, len(ids), 13):
            chunk = ids[start : start + 13]
            batch = runner._prepare([state("p", ids, table, computed=start)], [len(chunk)])
            native_chunks += sum(1 for c in batch.meta.prefills if c.table is not None)
            assert all(c.mask is None for c in batch.meta.prefills if c.table is not None)
            hidden = runner.model(batch.input_ids, batch.positions, batch.meta, runner.kv_cache)
            logits.append(runner.model.compute_logits(hidden))
        expected = hf(torch.tensor([ids])).logits[0]
    torch.testing.assert_close(torch.cat(logits), expected, atol=1e-4, rtol=1e-4)
    uses_kernel = backend == "auto" and runner.kernels is not None and runner.kernels.prefill_attention_supported(64)
    assert native_chunks == (5 if uses_kernel else 0)
