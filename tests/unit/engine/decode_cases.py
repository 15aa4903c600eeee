"""Decode-attention cases shared by the kernel tests: a query over scattered,
shuffled cache blocks, and the head shapes that take each code path."""

from __future__ import annotations

import torch


def random_case(
    seed: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    lens: list[int],
    block_size: int = 16,
    num_blocks: int = 96,
    dtype: torch.dtype = torch.float32,
):
    gen = torch.Generator().manual_seed(seed)
    keys = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=gen).to(dtype)
    values = torch.randn(kv_heads, num_blocks, block_size, head_dim, generator=gen).to(dtype)
    # scattered, shuffled blocks, as a long-running block pool hands them out
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables, taken = [], 0
    for length in lens:
        need = -(-length // block_size)
        tables.append(order[taken : taken + need])
        taken += need
    assert taken <= num_blocks
    width = max(len(t) for t in tables)
    padded = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    # the query is a strided view, as the model hands it over (q out of a fused qkv)
    qkv = torch.randn(len(lens), heads + 2 * kv_heads, head_dim, generator=gen).to(dtype)
    return qkv[:, :heads], keys, values, tables, padded, torch.tensor(lens, dtype=torch.int64)


CASES = {  # heads, kv_heads, head_dim: the vectorized sizes (64, 128) and the generic path (32, 80)
    "gqa3-d64": (9, 3, 64),
    "mha-d64": (4, 4, 64),
    "gqa4-d128": (8, 2, 128),
    "mqa-d32": (4, 1, 32),
    "gqa2-d80": (4, 2, 80),
}
