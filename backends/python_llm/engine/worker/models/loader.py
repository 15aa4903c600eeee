"""Reads HF `*.safetensors` weights (one file or shards) straight into the
model, fusing q/k/v and gate/up as it goes, cast to the target dtype/device."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch
from safetensors import safe_open

from ..model_info import ModelFolderError
from .llama import LlamaForCausalLM

log = logging.getLogger(__name__)

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# HF name inside a layer → (our parameter, which fused shard or None)
_LAYER_PARAMS: dict[str, tuple[str, str | None]] = {
    "input_layernorm.weight": ("input_layernorm.weight", None),
    "post_attention_layernorm.weight": ("post_attention_layernorm.weight", None),
    "self_attn.q_proj.weight": ("qkv_weight", "q"),
    "self_attn.k_proj.weight": ("qkv_weight", "k"),
    "self_attn.v_proj.weight": ("qkv_weight", "v"),
    "self_attn.q_proj.bias": ("qkv_bias", "q"),
    "self_attn.k_proj.bias": ("qkv_bias", "k"),
    "self_attn.v_proj.bias": ("qkv_bias", "v"),
    "self_attn.o_proj.weight": ("o_weight", None),
    "self_attn.o_proj.bias": ("o_bias", None),
    "mlp.gate_proj.weight": ("gate_up_weight", "gate"),
    "mlp.up_proj.weight": ("gate_up_weight", "up"),
    "mlp.gate_proj.bias": ("gate_up_bias", "gate"),
    "mlp.up_proj.bias": ("gate_up_bias", "up"),
    "mlp.down_proj.weight": ("down_weight", None),
    "mlp.down_proj.bias": ("down_bias", None),
}
_TOP_PARAMS = {
    "model.embed_tokens.weight": "embed_tokens",
    "model.norm.weight": "norm.weight",
    "lm_head.weight": "lm_head",
}
# buffers some checkpoints carry that the model recomputes
_IGNORED = re.compile(r"(rotary_emb\.inv_freq|\.masked_bias|\.attn\.bias)$")


def safetensors_files(model_dir: Path) -> list[Path]:
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"{model_dir}: no *.safetensors files (only safetensors weights are supported)")
    return files


def _shard_rows(model: LlamaForCausalLM, shard: str) -> slice:
    spec = model.spec
    q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
    ffn = spec.intermediate_size
    return {
        "q": slice(0, q),
        "k": slice(q, q + kv),
        "v": slice(q + kv, q + 2 * kv),
        "gate": slice(0, ffn),
        "up": slice(ffn, 2 * ffn),
    }[shard]


def _resolve(module: torch.nn.Module, dotted: str, name: str) -> torch.Tensor:
    """The parameter at `dotted` in `module`, for the checkpoint's weight `name`."""
    target: object = module
    for part in dotted.split("."):
        target = getattr(target, part)
    if target is None:
        raise ModelFolderError(f"weight {name}: the config declares no such bias")
    if not isinstance(target, torch.Tensor):
        raise TypeError(f"{dotted}: a {type(target).__name__}, not a parameter")
    return target


def _target(model: LlamaForCausalLM, name: str) -> tuple[torch.Tensor, slice | None, str]:
    """The tensor (and row range) an HF weight goes into, plus a key that
    identifies it for the 'everything loaded' check."""
    if name in _TOP_PARAMS:
        attr = _TOP_PARAMS[name]
        if attr == "lm_head" and model.spec.tie_word_embeddings:
            # some tied checkpoints still store a copy; the embedding is authoritative
            return torch.empty(0), None, "ignored"
        return _resolve(model, attr, name), None, attr
    match = _LAYER.match(name)
    if match and match.group(2) in _LAYER_PARAMS:
        index = int(match.group(1))
        if index >= model.spec.num_layers:
            raise ModelFolderError(f"weight {name}: layer {index} beyond num_hidden_layers")
        attr, shard = _LAYER_PARAMS[match.group(2)]
        param = _resolve(model.layers[index], attr, name)
        rows = _shard_rows(model, shard) if shard else None
        return param, rows, f"layers.{index}.{attr}.{shard or ''}"
    raise ModelFolderError(f"weight {name}: not part of a Llama-family model")


def _expected_keys(model: LlamaForCausalLM) -> set[str]:
    keys = {"embed_tokens", "norm.weight"}
    if not model.spec.tie_word_embeddings:
        keys.add("lm_head")
    for i, layer in enumerate(model.layers):
        for attr, shard in _LAYER_PARAMS.values():
            if getattr(layer, attr.split(".")[0]) is None:
                continue
            keys.add(f"layers.{i}.{attr}.{shard or ''}")
    return keys


@torch.inference_mode()
def load_weights(model: LlamaForCausalLM, model_dir: str | Path) -> None:
    folder = Path(model_dir)
    loaded: set[str] = set()
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device="cpu") as reader:
            for name in reader.keys():
                if _IGNORED.search(name):
                    continue
                param, rows, key = _target(model, name)
                if key == "ignored":
                    continue
                destination = param if rows is None else param[rows]
                tensor = reader.get_tensor(name)
                if tuple(tensor.shape) != tuple(destination.shape):
                    raise ModelFolderError(
                        f"weight {name}: shape {tuple(tensor.shape)} does not match the config's "
                        f"{tuple(destination.shape)}"
                    )
                destination.copy_(tensor)
                loaded.add(key)
    missing = _expected_keys(model) - loaded
    if missing:
        raise ModelFolderError(f"{folder}: weights missing for {sorted(missing)[:5]} ({len(missing)} in all)")
    log.info("weights loaded", extra={"model_dir": str(folder), "tensors": len(loaded)})
