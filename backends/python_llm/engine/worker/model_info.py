"""What the scheduler and engine need to know about a model, read from its
Hugging Face folder without loading any weights."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ModelFolderError(ValueError):
    """The model folder is missing, unreadable, or describes an unsupported model."""


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelFolderError(f"{path} not found") from None
    except json.JSONDecodeError as exc:
        raise ModelFolderError(f"{path}: invalid JSON ({exc})") from None


def _as_id_list(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


@dataclass
class ModelInfo:
    max_model_len: int
    vocab_size: int
    # Every id that ends generation: chat models often add e.g. <|eot_id|> in
    # generation_config.json next to config.json's single eos id.
    eos_token_ids: list[int]
    num_layers: int
    num_kv_heads: int
    head_dim: int

    @classmethod
    def from_model_dir(cls, model_dir: str, max_model_len: int | None = None) -> "ModelInfo":
        folder = Path(model_dir)
        config = read_json(folder / "config.json")
        generation_path = folder / "generation_config.json"
        generation = read_json(generation_path) if generation_path.is_file() else {}

        eos: list[int] = []
        for candidate in _as_id_list(generation.get("eos_token_id")) + _as_id_list(config.get("eos_token_id")):
            if candidate not in eos:
                eos.append(candidate)

        model_max = int(config.get("max_position_embeddings", 0))
        if model_max <= 0:
            raise ModelFolderError(f"{folder}/config.json: max_position_embeddings missing")
        if max_model_len is not None:
            if max_model_len <= 0:
                raise ModelFolderError(f"max_model_len: must be > 0, got {max_model_len}")
            if max_model_len > model_max:
                raise ModelFolderError(
                    f"max_model_len: {max_model_len} exceeds the model's max_position_embeddings {model_max}")
            model_max = max_model_len

        num_heads = int(config["num_attention_heads"])
        head_dim = config.get("head_dim") or int(config["hidden_size"]) // num_heads
        return cls(
            max_model_len=model_max,
            vocab_size=int(config["vocab_size"]),
            eos_token_ids=eos,
            num_layers=int(config["num_hidden_layers"]),
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            head_dim=int(head_dim),
        )
