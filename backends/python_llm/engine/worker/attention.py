"""Paged attention over the block-structured K/V cache.

Decodes (one new token each) on the CPU go to the native kernel
(`kernels/`, reads the blocks in place) when it is available; a
`DecodeBatch` carries their block tables. Otherwise (CUDA, no compiler,
`attention_backend: torch`) they are batched in PyTorch: every sequence's blocks are
gathered into one padded [seqs, kv_heads, context, head_dim] tensor and a
boolean mask hides the padding. Decode attention is memory-bound (it reads
all cached K/V), so decodes are grouped by context length, each group padded
only to its own longest member. Grouped-query attention needs no repeated
K/V: a decode's query heads that share a KV head become the query rows of
that head ([seqs, kv_heads, group, head_dim]).
Prefill chunks run one sequence at a time (they are few and large). On the
CPU they go to the native prefill kernel (`kernels/paged_prefill_attention.cpp`:
reads the chunk's context from its blocks in place, causal limit per row, no
mask). Otherwise (CUDA, no compiler, a head_dim it lacks, `attention_backend:
torch`) a chunk with no cached prefix attends to itself with SDPA's built-in
causal mask, and one that continues a cached prefix gathers its blocks and
uses an offset mask: a copy of the whole context and a [chunk, context] mask
in every layer.
All index tensors are built once per step (`AttentionMetadata`) and shared
by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .kernels import CpuKernels
from .kv_cache import PagedKVCache


@dataclass
class PrefillChunk:
    token_offset: int  # first row of this chunk in the flattened step batch
    num_tokens: int
    context_len: int  # start_position + num_tokens
    # only when the chunk continues a cached prefix, for the PyTorch path:
    block_ids: torch.Tensor | None = None  # [blocks covering context_len]
    mask: torch.Tensor | None = None  # [num_tokens, context_len] bool, True = attend
    # ... or, for any chunk, the native kernel (AttentionMetadata.kernels):
    table: torch.Tensor | None = None  # [blocks covering context_len] int32


@dataclass
class DecodeGroup:
    """Single-token sequences in rows row_start .. row_start+num_seqs-1 whose
    block tables are padded to the same width."""

    row_start: int
    num_seqs: int
    block_ids: torch.Tensor  # [num_seqs * width] padded block tables, flattened
    mask: torch.Tensor  # [num_seqs, 1, 1, width*block_size] bool, True = attend


@dataclass
class DecodeBatch:
    """All decodes (rows 0 .. num_seqs-1), for the native kernel."""

    num_seqs: int
    block_tables: torch.Tensor  # [rows, width] int32, padded with block 0 (BlockTableRows)
    table_rows: torch.Tensor  # [num_seqs] int64: each decode's row of block_tables
    context_lens: torch.Tensor  # [num_seqs] int64
    kernel: CpuKernels


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [T] cache slot of every new token
    # decodes come first in the step batch: either one kernel batch or
    # PyTorch groups
    decode_batch: DecodeBatch | None = None
    decodes: list[DecodeGroup] = field(default_factory=list)
    prefills: list[PrefillChunk] = field(default_factory=list)
    kernels: CpuKernels | None = None  # for prefill chunks with a `table`
    # the native kernels check their arguments on the first layer that uses
    # this metadata (the rest have the same shapes; a check costs ~20 µs)
    check_layer: int = 0


@dataclass
class LayerSliceRows:
    """A chunk that runs decoder layers [first_layer, end_layer) only
    (`scheduler_output.LayerSlice`): the last `num_rows` rows of the step
    batch. `hidden`: its states entering first_layer (None at layer 0, where
    they come from the embedding); `main_meta`: the step without it, for
    the layers it skips."""

    first_layer: int
    end_layer: int
    num_rows: int
    hidden: torch.Tensor | None
    main_meta: AttentionMetadata
    # filled in by the forward pass: seconds in the layers the chunk ran and in the others
    seconds_inside: float = 0.0
    seconds_outside: float = 0.0

    def own_seconds(self, num_layers: int) -> float | None:
        """The chunk's own share of the step: its layers' time less what
        those layers cost without it (the mean of the others); None when it
        ran every layer."""
        inside = self.end_layer - self.first_layer
        if inside >= num_layers:
            return None
        return max(self.seconds_inside - inside * self.seconds_outside / (num_layers - inside), 0.0)


def _gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor, num_seqs: int) -> torch.Tensor:
    """[kv_heads, blocks, bs, d] → [seqs, kv_heads, blocks_per_seq*bs, d]."""
    heads, _, _, d = cache.shape
    gathered = cache.index_select(1, block_ids)
    return gathered.view(heads, num_seqs, -1, d).transpose(0, 1)


def paged_attention(
    layer: int,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    meta: AttentionMetadata,
    cache: PagedKVCache,
    scale: float,
) -> torch.Tensor:
    """Attention for one layer. query [T, heads, d], key/value [T, kv_heads, d]
    (already written to the cache). Returns [T, heads * d]."""
    rows_total, num_heads, d = query.shape
    kv_heads = key.shape[1]
    group = num_heads // kv_heads
    # every part writes its rows of one output: the decodes' and chunks'
    # results concatenated afterwards would copy [T, heads * d] once more
    # in every layer of a mixed step
    out = query.new_empty(rows_total, num_heads * d)

    batch = meta.decode_batch
    if batch is not None:
        # arguments are checked on the step's first layer; the others have
        # the same shapes (the checks cost ~20 µs a call)
        batch.kernel.paged_decode_attention(
            out[: batch.num_seqs],
            query[: batch.num_seqs],
            cache.keys[layer],
            cache.values[layer],
            batch.block_tables,
            batch.context_lens,
            scale,
            check=layer == meta.check_layer,
            table_rows=batch.table_rows,
        )

    for decode in meta.decodes:
        n = decode.num_seqs
        k = _gather_blocks(cache.keys[layer], decode.block_ids, n)
        v = _gather_blocks(cache.values[layer], decode.block_ids, n)
        q = query[decode.row_start : decode.row_start + n].view(n, kv_heads, group, d)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=decode.mask, scale=scale)
        out[decode.row_start : decode.row_start + n] = attended.reshape(n, num_heads * d)

    for chunk in meta.prefills:
        rows = slice(chunk.token_offset, chunk.token_offset + chunk.num_tokens)
        if chunk.table is not None:
            # type-ignored below: a chunk with a block table runs only when the native kernels are loaded
            meta.kernels.paged_prefill_attention(  # type: ignore[union-attr]
                out[rows],
                query[rows],
                cache.keys[layer],
                cache.values[layer],
                chunk.table,
                chunk.context_len - chunk.num_tokens,
                scale,
                check=layer == meta.check_layer,
            )
            continue
        q = query[rows].transpose(0, 1).unsqueeze(0)  # [1, heads, t, d]
        if chunk.block_ids is None:
            k = key[rows].transpose(0, 1).unsqueeze(0)
            v = value[rows].transpose(0, 1).unsqueeze(0)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=group > 1)
        else:
            k = _gather_blocks(cache.keys[layer], chunk.block_ids, 1)[:, :, : chunk.context_len]
            v = _gather_blocks(cache.values[layer], chunk.block_ids, 1)[:, :, : chunk.context_len]
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=chunk.mask, scale=scale, enable_gqa=group > 1)
        out[rows] = attended.squeeze(0).transpose(0, 1).reshape(chunk.num_tokens, num_heads * d)
    return out
