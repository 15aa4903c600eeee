"""What the decode-attention kernel must compute, in plain PyTorch: each
sequence's blocks gathered, cut to its length, and SDPA over them (fp32).
The check of `python -m python_llm.engine.worker.kernels` and the unit tests use it."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def decode_attention_reference(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                               tables: list[list[int]], lens: list[int], scale: float) -> torch.Tensor:
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
