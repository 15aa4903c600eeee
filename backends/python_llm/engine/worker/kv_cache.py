"""The paged K/V tensors.

Per layer one K and one V tensor shaped [num_kv_heads, num_blocks, block_size,
head_dim]. Heads lead so that gathering whole blocks for a batch of sequences
(`index_select` on dim 1) yields [kv_heads, seqs, context, head_dim] views
whose inner [context, head_dim] matrices are contiguous, which is what the
attention matmuls want; viewed as [kv_heads, num_blocks*block_size, head_dim]
one slot index addresses one token, so new K/V land with one `index_copy_`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .huge_pages import empty_on_huge_pages


@dataclass(frozen=True)
class KVCacheShape:
    num_layers: int
    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_blocks", "block_size", "num_kv_heads", "head_dim"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name}: must be > 0, got {getattr(self, name)}")


def bytes_per_block(num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """Memory one block costs across all layers, K and V."""
    element = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * element


class PagedKVCache:
    def __init__(self, shape: KVCacheShape, dtype: torch.dtype, device: torch.device | str) -> None:
        self.shape = shape
        dims = (shape.num_kv_heads, shape.num_blocks, shape.block_size, shape.head_dim)
        self.keys = [self._zeros(dims, dtype, device) for _ in range(shape.num_layers)]
        self.values = [self._zeros(dims, dtype, device) for _ in range(shape.num_layers)]

    @staticmethod
    def _zeros(dims: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
        # zeros, not empty: padded gathers read unwritten slots (masked out,
        # but NaN garbage times a zero weight would still poison the output)
        if torch.device(device).type != "cpu":
            return torch.zeros(dims, dtype=dtype, device=device)
        return empty_on_huge_pages(dims, dtype).zero_()  # decode reads blocks scattered over all of it

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor) -> None:
        """Store new tokens' K/V ([T, kv_heads, head_dim]) at their slots ([T])."""
        heads, d = self.shape.num_kv_heads, self.shape.head_dim
        self.keys[layer].view(heads, -1, d).index_copy_(1, slot_mapping, key.transpose(0, 1))
        self.values[layer].view(heads, -1, d).index_copy_(1, slot_mapping, value.transpose(0, 1))
