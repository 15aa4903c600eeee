"""What the scheduler and engine need to know about a model, read from its
Hugging Face folder without loading any weights."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ensemble.tokenizer_info import load_tokenizer_info


class ModelFolderError(ValueError):
    """The model folder is missing, unreadable, or describes an unsupported model."""


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFolderError(f"{path} not found") from None
    except json.JSONDecodeError as exc:
        raise ModelFolderError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path}: not a JSON object")
    return data


def attention_parity_context(config: dict[str, Any], num_heads: int, head_dim: int) -> float:
    """GEMM multiply-adds of one token in one layer (q/k/v, o, gate/up,
    down) over the attention multiply-adds per token of context (QK and PV:
    2 x heads x head_dim); 0 when the config lacks a size."""
    try:
        hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    except (KeyError, TypeError, ValueError):
        return 0.0
    kv_heads = int(config.get("num_key_value_heads") or num_heads)
    attention_width = num_heads * head_dim
    gemm = hidden * (attention_width + 2 * kv_heads * head_dim) + attention_width * hidden + 3 * hidden * inter
    return gemm / (2 * attention_width)


@dataclass
class ModelInfo:
    model_dir: str
    max_model_len: int
    vocab_size: int
    num_layers: int
    num_kv_heads: int
    head_dim: int
    # the context at which a prefill token's attention FLOPs equal those of
    # its GEMMs (prefill pacing's cost model); 0 = unknown
    attention_parity_context: float = 0.0

    @cached_property
    def eos_token_ids(self) -> list[int]:
        """Every id that ends generation, by the text stages' one rule
        (`ensemble/tokenizer_info.py`: generation_config.json, config.json and
        the tokenizer's eos_token merged), so the engine stops on exactly the
        ids the detokenizer treats as the end. Read on first use: the engine
        needs it, the runner does not (and runs folders without a tokenizer)."""
        try:
            return list(load_tokenizer_info(self.model_dir).eos_token_ids)
        except (OSError, ValueError) as exc:
            raise ModelFolderError(f"{self.model_dir}: cannot read the EOS ids ({exc})") from None

    @classmethod
    def from_model_dir(cls, model_dir: str, max_model_len: int | None) -> ModelInfo:
        """`max_model_len`: the engine's cap (EngineConfig.max_model_len); None keeps the model's own."""
        folder = Path(model_dir)
        config = read_json(folder / "config.json")
        model_max = int(config.get("max_position_embeddings", 0))
        if model_max <= 0:
            raise ModelFolderError(f"{folder}/config.json: max_position_embeddings missing")
        if max_model_len is not None:
            if max_model_len <= 0:
                raise ModelFolderError(f"max_model_len: must be > 0, got {max_model_len}")
            if max_model_len > model_max:
                raise ModelFolderError(
                    f"max_model_len: {max_model_len} exceeds the model's max_position_embeddings {model_max}"
                )
            model_max = max_model_len

        num_heads = int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or int(config["hidden_size"]) // num_heads
        return cls(
            attention_parity_context=attention_parity_context(config, num_heads, int(head_dim)),
            model_dir=str(model_dir),
            max_model_len=model_max,
            vocab_size=int(config["vocab_size"]),
            num_layers=int(config["num_hidden_layers"]),
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
        )
