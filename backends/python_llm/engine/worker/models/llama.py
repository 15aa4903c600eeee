"""Llama-family decoder (Llama 2/3, SmolLM, Mistral, Qwen2) over the paged KV
cache. Every step's tokens are one flat [T, hidden] batch, so each projection
is one GEMM; q/k/v and gate/up are fused into single weights by the loader.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionMetadata, LayerSliceRows, paged_attention
from ..kernels import CpuKernels
from ..kv_cache import PagedKVCache
from ..model_info import ModelFolderError
from .greedy_head import GreedyHeads, VerifiedGreedyHead
from .int16_greedy_head import Int16GreedyHead
from .packed_linear import LayerProjections, Linear, LinearMaker, TorchLinear

LM_HEAD_CHUNK = 2048  # vocabulary rows per LM-head GEMM on the CPU

# Greedy steps with at least this many rows run the packed LM head's GEMM
# and a native argmax over its logits; fewer rows the fused LM head + argmax,
# which reads the weights once and writes no logits but re-reads the hidden
# rows for every four weight rows. Measured on the 2-core AVX-512 Intel
# machine (`python -m bench.lm_head_probe`, docs/benchmarks.md): fused vs
# oneDNN 1 row 7.7 vs 7.9 ms, 4 rows 10.0 vs 8.9, 64 rows 51.8 vs 30.6.
LM_HEAD_GEMM_MIN_ROWS = 4


def sliced_lm_head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden @ weight.T in LM_HEAD_CHUNK-row slices of the vocabulary: on
    the CPU one GEMM against the whole vocabulary runs at half the speed of
    slices whose weights fit in cache (measured: 82 vs 45 ms for 64 rows x
    49k x 576 fp32 on 2 cores)."""
    vocab = weight.shape[0]
    logits = hidden.new_empty(hidden.shape[0], vocab)
    for start in range(0, vocab, LM_HEAD_CHUNK):
        end = min(start + LM_HEAD_CHUNK, vocab)
        torch.mm(hidden, weight[start:end].t(), out=logits[:, start:end])
    return logits


@dataclass(frozen=True)
class LlamaSpec:
    """The architecture numbers, normalised from an HF config.json."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    tie_word_embeddings: bool

    @classmethod
    def from_hf_config(cls, config: dict[str, Any]) -> LlamaSpec:
        if config.get("hidden_act", "silu") != "silu":
            raise ModelFolderError(f"hidden_act: only 'silu' is supported, got {config['hidden_act']!r}")
        model_type = config.get("model_type", "llama")
        num_heads = int(config["num_attention_heads"])
        # transformers 5 keeps rope settings in `rope_parameters`; 4.x in
        # `rope_theta` + `rope_scaling`
        rope = dict(config.get("rope_parameters") or {})
        legacy_scaling = config.get("rope_scaling")
        if legacy_scaling:
            rope.update(legacy_scaling)
        rope_theta = float(rope.get("rope_theta", config.get("rope_theta", 10000.0)))
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type not in ("default", "llama3"):
            raise ModelFolderError(f"rope_type: only 'default' and 'llama3' are supported, got {rope_type!r}")
        if float(rope.get("partial_rotary_factor", 1.0)) != 1.0:
            raise ModelFolderError("partial_rotary_factor: only 1.0 is supported")
        attention_bias = bool(config.get("attention_bias", False))
        qwen2 = model_type == "qwen2"
        return cls(
            hidden_size=int(config["hidden_size"]),
            intermediate_size=int(config["intermediate_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(config.get("head_dim") or int(config["hidden_size"]) // num_heads),
            vocab_size=int(config["vocab_size"]),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=rope_theta,
            rope_scaling={**rope, "rope_type": rope_type} if rope_type != "default" else None,
            max_position_embeddings=int(config["max_position_embeddings"]),
            qkv_bias=qwen2 or attention_bias,  # Qwen2 always has q/k/v bias
            o_bias=attention_bias and not qwen2,
            mlp_bias=bool(config.get("mlp_bias", False)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        )


def rope_inverse_frequencies(spec: LlamaSpec) -> torch.Tensor:
    """HF's `default` and `llama3` inverse frequencies, in fp32."""
    d = spec.head_dim
    inv_freq = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    scaling = spec.rope_scaling
    if scaling is None:
        return inv_freq
    factor = float(scaling["factor"])
    low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
    old_len = float(scaling["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


class RotaryTable(nn.Module):
    """cos/sin for every position, computed once; a step just indexes it."""

    cos: torch.Tensor  # buffers, which nn.Module's attribute lookup does not type
    sin: torch.Tensor

    def __init__(self, spec: LlamaSpec, max_positions: int, dtype: torch.dtype) -> None:
        super().__init__()
        inv_freq = rope_inverse_frequencies(spec)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos().to(dtype), persistent=False)
        self.register_buffer("sin", emb.sin().to(dtype), persistent=False)

    def lookup(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """[T] positions → cos, sin shaped [T, 1, head_dim] (broadcast over heads)."""
        return self.cos[positions].unsqueeze(1), self.sin[positions].unsqueeze(1)


@dataclass(frozen=True)
class StepRope:
    """A step's rotary inputs: its positions [T] and cos / sin, which are
    either the positions' rows [T, 1, head_dim] (the PyTorch path) or the
    whole tables [max_positions, head_dim], which the native kernel indexes."""

    positions: torch.Tensor
    cos: torch.Tensor | None = None
    sin: torch.Tensor | None = None


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype, device=device), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # HF order of operations (fp32 statistics, weight applied after the
        # cast back), so fp32 results match the reference bit for bit
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def _param(*shape: int, dtype: torch.dtype, device: torch.device) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype, device=device), requires_grad=False)


def _rows(attended: torch.Tensor, x: torch.Tensor, rows: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    return (attended, x) if rows is None else (attended[rows], x[rows])


class DecoderLayer(nn.Module):
    def __init__(self, index: int, spec: LlamaSpec, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.index = index
        self.num_heads, self.num_kv_heads, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale = spec.head_dim**-0.5
        h, d = spec.hidden_size, spec.head_dim
        qkv_out = (spec.num_heads + 2 * spec.num_kv_heads) * d
        self.input_layernorm = RMSNorm(h, spec.rms_norm_eps, dtype, device)
        self.post_attention_layernorm = RMSNorm(h, spec.rms_norm_eps, dtype, device)
        self.qkv_weight = _param(qkv_out, h, dtype=dtype, device=device)
        self.qkv_bias = _param(qkv_out, dtype=dtype, device=device) if spec.qkv_bias else None
        self.o_weight = _param(h, spec.num_heads * d, dtype=dtype, device=device)
        self.o_bias = _param(h, dtype=dtype, device=device) if spec.o_bias else None
        self.gate_up_weight = _param(2 * spec.intermediate_size, h, dtype=dtype, device=device)
        self.gate_up_bias = _param(2 * spec.intermediate_size, dtype=dtype, device=device) if spec.mlp_bias else None
        self.down_weight = _param(h, spec.intermediate_size, dtype=dtype, device=device)
        self.down_bias = _param(h, dtype=dtype, device=device) if spec.mlp_bias else None
        # the reference until pack(): F.linear on the parameters the loader fills
        self.projections = LayerProjections(
            qkv=TorchLinear(self.qkv_weight, self.qkv_bias),
            o=TorchLinear(self.o_weight, self.o_bias),
            gate_up=TorchLinear(self.gate_up_weight, self.gate_up_bias),
            down=TorchLinear(self.down_weight, self.down_bias),
        )
        # the native elementwise steps (fp32 CPU), None: the PyTorch ops
        self.kernels: CpuKernels | None = None

    def pack(self, make_linear: LinearMaker) -> None:
        """Move the projections into a packed layout (packed_linear.py's
        PackedLinear, AmxLinear or FmaLinear). The nn.Parameters are
        emptied: keeping them too would hold every weight once more."""
        self.projections = LayerProjections(
            qkv=make_linear(self.qkv_weight, self.qkv_bias),
            o=make_linear(self.o_weight, self.o_bias),
            gate_up=make_linear(self.gate_up_weight, self.gate_up_bias),
            down=make_linear(self.down_weight, self.down_bias),
        )
        for name in ("qkv_weight", "o_weight", "gate_up_weight", "down_weight"):
            getattr(self, name).data = torch.empty(0, dtype=self.qkv_weight.dtype)

    def forward(
        self,
        x: torch.Tensor,
        rope: StepRope,
        meta: AttentionMetadata,
        cache: PagedKVCache,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The residual adds are the projections' `plus` (fused into oneDNN's
        GEMM when packed; addition commutes exactly, so only the GEMMs'
        summation order differs from the reference). SiLU x up stays outside
        the GEMM: as epilogues of split gate and up GEMMs (oneDNN's `swish`,
        `mul`) the MLP took 201 ms instead of 112 at 64 rows over 30 layers,
        and 868 instead of 704 at 512. With `output_rows`, every row's K/V
        goes into the cache but only those rows (in that order) go on past
        the attention; with none, the native path stops at the K/V write."""
        p = self.projections
        kernels = self.kernels
        if kernels is None:
            qkv = p.qkv(self.input_layernorm(x))
            attended, x = _rows(self._attention(qkv, rope, meta, cache), x, output_rows)
            x = p.o.plus(attended, x)
            gate, up = p.gate_up(self.post_attention_layernorm(x)).chunk(2, dim=-1)
            return p.down.plus(F.silu(gate) * up, x)
        norm = self.input_layernorm
        qkv = p.qkv(kernels.rms_norm(x, norm.weight, norm.eps))
        kernels.rotary_cache_write(
            qkv,
            self.num_heads,
            self.num_kv_heads,
            rope.positions,
            # the native path's step always has its rotary tables (Optional for the torch path)
            rope.cos,  # type: ignore[arg-type]
            rope.sin,  # type: ignore[arg-type]
            meta.slot_mapping,
            cache.keys[self.index],
            cache.values[self.index],
            check=self.index == meta.check_layer,
        )
        if output_rows is not None and output_rows.shape[0] == 0:  # no row of the step is read
            return x[:0]
        attended, x = _rows(self._attend(qkv, meta, cache), x, output_rows)
        x = p.o.plus(attended, x)
        norm = self.post_attention_layernorm
        return p.down.plus(kernels.silu_mul(p.gate_up(kernels.rms_norm(x, norm.weight, norm.eps))), x)

    def _attention(
        self, qkv: torch.Tensor, rope: StepRope, meta: AttentionMetadata, cache: PagedKVCache
    ) -> torch.Tensor:
        """Rotary, the K/V write and attention in PyTorch ops."""
        t = qkv.shape[0]
        qkv = qkv.view(t, self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        # type-ignored below: rope.cos / rope.sin are set for every step that runs rotary
        qk = rotate(qkv[:, : self.num_heads + self.num_kv_heads], rope.cos, rope.sin)  # type: ignore[arg-type]
        q, k = qk[:, : self.num_heads], qk[:, self.num_heads :]
        v = qkv[:, self.num_heads + self.num_kv_heads :]
        cache.write(self.index, k, v, meta.slot_mapping)
        return paged_attention(self.index, q, k, v, meta, cache, self.scale)

    def _attend(self, qkv: torch.Tensor, meta: AttentionMetadata, cache: PagedKVCache) -> torch.Tensor:
        """Attention over q / k / v already rotated in qkv and in the cache."""
        qkv = qkv.view(qkv.shape[0], self.num_heads + 2 * self.num_kv_heads, self.head_dim)
        heads, kv_heads = self.num_heads, self.num_kv_heads
        return paged_attention(
            self.index,
            qkv[:, :heads],
            qkv[:, heads : heads + kv_heads],
            qkv[:, heads + kv_heads :],
            meta,
            cache,
            self.scale,
        )


class LlamaForCausalLM(nn.Module):
    def __init__(self, spec: LlamaSpec, max_positions: int, dtype: torch.dtype, device: torch.device) -> None:
        super().__init__()
        self.spec = spec
        self.embed_tokens = _param(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
        self.layers = nn.ModuleList(DecoderLayer(i, spec, dtype, device) for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, dtype, device)
        # tied models share the embedding matrix; the loader sets it
        self.lm_head: torch.Tensor = (
            self.embed_tokens
            if spec.tie_word_embeddings
            else _param(spec.vocab_size, spec.hidden_size, dtype=dtype, device=device)
        )
        self.rotary = RotaryTable(spec, max_positions, dtype).to(device)
        self.kernels: CpuKernels | None = None
        # the LM head packed as the projections are (pack_linears), else None
        self.lm_head_gemm: Linear | None = None
        # greedy rows' bf16 or int16 LM head with its exact argmax (use_verified_greedy), else None
        self.greedy_head: VerifiedGreedyHead | Int16GreedyHead | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        cache: PagedKVCache,
        layer_slice: LayerSliceRows | None = None,
        output_rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[T] tokens → [T, hidden] last-layer states (before the final norm);
        with `output_rows` (and no layer slice), only those rows' states, in
        that order: the last layer computes the others' K/V and stops there,
        as llama.cpp does, since nothing reads a prompt token's state but its
        K/V (its output projection and MLP are 85% of a layer's FLOPs: ~2.5%
        of a prefill step here). With `layer_slice`, its rows (the last ones)
        hold their states after its end layer, and it joins the batch only in
        its layers (one GEMM per projection for all rows there)."""
        rope = self._rope(positions)
        if layer_slice is None:
            x = F.embedding(input_ids, self.embed_tokens)
            last = len(self.layers) - 1
            for index, layer in enumerate(self.layers):
                x = layer(x, rope, meta, cache, output_rows if index == last else None)
            return x
        main = input_ids.shape[0] - layer_slice.num_rows
        held = layer_slice.hidden
        if held is None:  # from layer 0: its rows start as embeddings too
            x = F.embedding(input_ids, self.embed_tokens)
            x, held = x[:main], x[main:]
        else:
            x = F.embedding(input_ids[:main], self.embed_tokens)
        main_rope = self._rope(positions[:main])
        first, end = layer_slice.first_layer, layer_slice.end_layer
        through = end == len(self.layers)  # the chunk's rows stay in the batch to the last layer
        clock = time.perf_counter  # the pacer sizes slices by these (CPU: the ops are synchronous)
        inside = outside = 0.0
        for index, layer in enumerate(self.layers):
            started = clock()
            if index == first:
                x = torch.cat((x, held))
            if first <= index < end:
                x = layer(x, rope, meta, cache)
                if index == end - 1 and not through:
                    x, held = x[:main], x[main:]
                inside += clock() - started
            else:
                x = layer(x, main_rope, layer_slice.main_meta, cache)
                outside += clock() - started
        layer_slice.seconds_inside, layer_slice.seconds_outside = inside, outside
        return x if through else torch.cat((x, held))

    def decoder_layers(self) -> Iterable[DecoderLayer]:
        """`layers` as what they are: a ModuleList hands its entries out as plain Modules."""
        return cast("Iterable[DecoderLayer]", self.layers)

    def _rope(self, positions: torch.Tensor) -> StepRope:
        if self.kernels is None:
            return StepRope(positions, *self.rotary.lookup(positions))
        return StepRope(positions, self.rotary.cos, self.rotary.sin)

    def pack_linears(self, make_linear: LinearMaker, make_lm_head: LinearMaker) -> None:
        """Every decoder layer's projections packed by `make_linear`; the LM
        head gets a packed copy by `make_lm_head` for steps of many rows; its
        plain weight stays, as the embedding when tied, and for the fused
        LM-head + argmax kernel of greedy steps of few rows."""
        for layer in self.decoder_layers():
            layer.pack(make_linear)
        self.lm_head_gemm = make_lm_head(self.lm_head.detach(), None)

    def use_kernels(self, kernels: CpuKernels) -> None:
        """The native elementwise steps (RMSNorm, rotary + K/V write, SiLU x
        up) in every layer; fp32 on the CPU only."""
        if self.embed_tokens.dtype != torch.float32 or self.embed_tokens.device.type != "cpu":
            raise ValueError("use_kernels: the native elementwise kernels run fp32 models on the CPU")
        self.kernels = kernels
        for layer in self.decoder_layers():
            layer.kernels = kernels

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final norm + LM head for the rows that are sampled; fp32 logits."""
        normed = self._final_norm(hidden)
        if normed.device.type != "cpu":
            return F.linear(normed, self.lm_head).float()
        if self.lm_head_gemm is not None:
            return self.lm_head_gemm(normed)
        return sliced_lm_head(normed, self.lm_head).float()

    def use_verified_greedy(self, precision: str = "bf16") -> None:
        """Greedy rows take the LM head in `precision` (bf16: greedy_head.py,
        int16: int16_greedy_head.py) and the exact argmax over its
        candidates; needs the native kernels."""
        if self.kernels is None:
            raise RuntimeError("use_verified_greedy: the native kernels are not in use")
        if precision not in GreedyHeads:
            raise ValueError(f"use_verified_greedy: precision {precision!r} is not one of {sorted(GreedyHeads)}")
        self.greedy_head = GreedyHeads[precision](self.lm_head, self.kernels)

    def greedy_tokens(self, hidden: torch.Tensor) -> list[int]:
        """argmax of final norm + LM head for the sampled rows, through the
        native kernels (fp32 CPU models): the bf16 or int16 LM head and its
        verified argmax where it is in use (a row it cannot decide, not finite, goes
        the fp32 way); else the packed LM head then a native argmax for
        LM_HEAD_GEMM_MIN_ROWS rows or more, else the LM head fused with its
        argmax (no logits)."""
        kernels = self.kernels
        if kernels is None:
            raise RuntimeError("greedy_tokens: the native kernels are not in use")
        normed = self._final_norm(hidden)
        if self.greedy_head is None:
            return self._fp32_greedy_tokens(normed, kernels)
        tokens, _ = self.greedy_head(normed)
        undecided = [row for row, token in enumerate(tokens) if token < 0]
        if undecided:
            for row, token in zip(undecided, self._fp32_greedy_tokens(normed[undecided], kernels)):
                tokens[row] = token
        return tokens

    def _fp32_greedy_tokens(self, normed: torch.Tensor, kernels: CpuKernels) -> list[int]:
        if self.lm_head_gemm is not None and normed.shape[0] >= LM_HEAD_GEMM_MIN_ROWS:
            return kernels.argmax_rows(self.lm_head_gemm(normed)).tolist()
        return kernels.lm_head_argmax(normed, self.lm_head)

    def _final_norm(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.kernels is None:
            normed: torch.Tensor = self.norm(hidden)
            return normed
        return self.kernels.rms_norm(hidden, self.norm.weight, self.norm.eps)
