"""What the decode-attention kernel must compute, in plain PyTorch: each
sequence's blocks gathered, cut to its length, and SDPA over them (fp32).
The check of `python -m python_llm.engine.worker.kernels` and the unit tests use it."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def decode_attention_reference(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    tables: list[list[int]],
    lens: list[int],
    scale: float,
) -> torch.Tensor:
    """query [S, H, D], caches [kv_heads, blocks, block_size, D] → [S, H*D] fp32."""
    kv_heads, _, _, head_dim = keys.shape
    heads = query.shape[1]
    rows = []
    for s, (table, length) in enumerate(zip(tables, lens)):
        index = torch.tensor(table)
        k = keys.float().index_select(1, index).reshape(kv_heads, -1, head_dim)[:, :length]
        v = values.float().index_select(1, index).reshape(kv_heads, -1, head_dim)[:, :length]
        q = query[s].float().reshape(kv_heads, heads // kv_heads, head_dim)
        rows.append(F.scaled_dot_product_attention(q, k, v, scale=scale).reshape(-1))
    return torch.stack(rows)


def prefill_attention_reference(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, table: list[int], start: int, scale: float
) -> torch.Tensor:
    """What the prefill-chunk kernel must compute: query [N, H, D] at
    positions start .. start+N-1, causal over the cached positions 0 ..
    start+N-1 found through `table` in caches [kv_heads, blocks, block_size, D]
    → [N, H*D] fp32 (the engine's PyTorch path: gather, offset mask, SDPA)."""
    kv_heads, _, _, head_dim = keys.shape
    n, heads, _ = query.shape
    context = start + n
    index = torch.tensor(table)
    k = keys.float().index_select(1, index).reshape(kv_heads, -1, head_dim)[:, :context]
    v = values.float().index_select(1, index).reshape(kv_heads, -1, head_dim)[:, :context]
    mask = torch.arange(context).unsqueeze(0) <= torch.arange(start, context).unsqueeze(1)
    q = query.float().transpose(0, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=heads != kv_heads)
    return out.transpose(0, 1).reshape(n, heads * head_dim)
