"""The native elementwise kernels of a decoder layer (RMSNorm, rotary + K/V
cache write, SiLU x up) against the PyTorch ops they replace, and their
refusals of arguments the C side would otherwise trust."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from python_llm.engine.worker.kernels import CpuKernels, cpu_kernels
from python_llm.engine.worker.kv_cache import KVCacheShape, PagedKVCache
from python_llm.engine.worker.models.llama import LlamaSpec, RMSNorm, RotaryTable, rotate


@pytest.fixture(scope="module")
def native() -> CpuKernels:
    built = cpu_kernels()
    assert built is not None, "the CPU kernels did not build on this machine (see the warning log)"
    return built


def _spec(heads: int, kv_heads: int, head_dim: int, theta: float = 10000.0) -> LlamaSpec:
    return LlamaSpec(
        hidden_size=heads * head_dim,
        intermediate_size=4 * head_dim,
        num_layers=1,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=32,
        rms_norm_eps=1e-5,
        rope_theta=theta,
        rope_scaling=None,
        max_position_embeddings=4096,
        qkv_bias=False,
        o_bias=False,
        mlp_bias=False,
        tie_word_embeddings=True,
    )


# 1 and 64 rows run on one thread, 512 x 576 on the pool
@pytest.mark.parametrize("rows,dim", [(1, 576), (64, 576), (512, 576), (3, 100)])
def test_rms_norm_matches_the_module(native, rows: int, dim: int) -> None:
    gen = torch.Generator().manual_seed(rows)
    norm = RMSNorm(dim, 1e-5, torch.float32, torch.device("cpu"))
    norm.weight.data = torch.randn(dim, generator=gen)
    x = torch.randn(rows + 3, dim, generator=gen) * 4
    view = x[2 : 2 + rows]  # a row-strided view, as a slice of the step batch
    torch.testing.assert_close(native.rms_norm(view, norm.weight, norm.eps), norm(view), atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (4, 4, 128), (8, 1, 32)])
@pytest.mark.parametrize("tokens", [1, 7, 300])
def test_rotary_cache_write_matches_rotate_and_index_copy(
    native, heads: int, kv_heads: int, head_dim: int, tokens: int
) -> None:
    gen = torch.Generator().manual_seed(tokens * heads)
    table = RotaryTable(_spec(heads, kv_heads, head_dim), 4096, torch.float32)
    block_size, num_blocks = 16, 40
    positions = torch.randint(0, 4096, (tokens,), generator=gen)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:tokens]
    qkv = torch.randn(tokens, (heads + 2 * kv_heads) * head_dim, generator=gen)

    # the reference: the model's PyTorch path
    shape = KVCacheShape(1, num_blocks, block_size, kv_heads, head_dim)
    expected_cache = PagedKVCache(shape, torch.float32, "cpu")
    heads3 = qkv.view(tokens, heads + 2 * kv_heads, head_dim)
    cos, sin = table.lookup(positions)
    qk = rotate(heads3[:, : heads + kv_heads], cos, sin)
    expected_cache.write(0, qk[:, heads:], heads3[:, heads + kv_heads :], slots)

    cache = PagedKVCache(shape, torch.float32, "cpu")
    native.rotary_cache_write(
        qkv, heads, kv_heads, positions, table.cos, table.sin, slots, cache.keys[0], cache.values[0]
    )
    rotated = qkv.view(tokens, heads + 2 * kv_heads, head_dim)
    torch.testing.assert_close(rotated[:, : heads + kv_heads], qk, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(rotated[:, heads + kv_heads :], heads3[:, heads + kv_heads :], atol=0, rtol=0)
    torch.testing.assert_close(cache.keys[0], expected_cache.keys[0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.values[0], expected_cache.values[0], atol=0, rtol=0)


def test_rotary_cache_write_refuses_out_of_range_positions_and_slots(native) -> None:
    table = RotaryTable(_spec(2, 1, 8), 16, torch.float32)
    cache = PagedKVCache(KVCacheShape(1, 2, 4, 1, 8), torch.float32, "cpu")
    qkv = torch.randn(2, 4 * 8)
    before = qkv.clone()
    cases = [
        (torch.tensor([0, 16]), torch.tensor([0, 1]), "a position"),
        (torch.tensor([0, -1]), torch.tensor([0, 1]), "a position"),
        (torch.tensor([0, 1]), torch.tensor([0, 8]), "a slot"),
    ]
    for positions, slots, what in cases:
        with pytest.raises(ValueError, match=what):
            native.rotary_cache_write(qkv, 2, 1, positions, table.cos, table.sin, slots, cache.keys[0], cache.values[0])
    assert torch.equal(qkv, before) and not cache.keys[0].any(), "a refused call wrote nothing"
    with pytest.raises(ValueError, match="qkv"):
        native.rotary_cache_write(
            qkv[:, :24],
            2,
            1,
            torch.tensor([0, 1]),
            table.cos,
            table.sin,
            torch.tensor([0, 1]),
            cache.keys[0],
            cache.values[0],
        )
    with pytest.raises(ValueError, match="int64"):
        native.rotary_cache_write(
            qkv,
            2,
            1,
            torch.tensor([0, 1], dtype=torch.int32),
            table.cos,
            table.sin,
            torch.tensor([0, 1]),
            cache.keys[0],
            cache.values[0],
        )


@pytest.mark.parametrize("rows,inter", [(1, 1536), (64, 1536), (512, 1536), (5, 33)])
def test_silu_mul_matches_torch(native, rows: int, inter: int) -> None:
    gen = torch.Generator().manual_seed(rows + inter)
    gate_up = torch.randn(rows, 2 * inter, generator=gen) * 6
    gate_up[0, :4] = torch.tensor([-100.0, -88.0, 0.0, 100.0])  # far tails and zero
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(native.silu_mul(gate_up), F.silu(gate) * up, atol=1e-6, rtol=2e-6)


def test_elementwise_kernels_refuse_other_layouts(native) -> None:
    with pytest.raises(ValueError, match="rms_norm"):
        native.rms_norm(torch.randn(4, 8).t(), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="rms_norm"):
        native.rms_norm(torch.randn(4, 8, dtype=torch.float64), torch.ones(8, dtype=torch.float64), 1e-5)
    with pytest.raises(ValueError, match="silu_mul"):
        native.silu_mul(torch.randn(4, 7))
