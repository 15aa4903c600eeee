"""ModelInfo and weight loading edge cases."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ensemble.tokenizer_info import load_tokenizer_info
from python_llm.engine.config import EngineConfig
from python_llm.engine.worker.model_info import ModelFolderError, ModelInfo
from python_llm.engine.worker.runner import ModelRunner
from tests.unit.engine.test_model_tiny import save_tiny


def write_config(folder: Path, config: dict, generation: dict | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    if generation is not None:
        (folder / "generation_config.json").write_text(json.dumps(generation))
    return folder


def write_tokenizer(folder: Path, eos_token: str | None = None) -> None:
    """A word-level tokenizer whose token "t<i>" has id i (i < 20)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    Tokenizer(WordLevel({f"t{i}": i for i in range(20)}, unk_token="t0")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({} if eos_token is None else {"eos_token": eos_token}))


BASE = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 100,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "num_hidden_layers": 3,
    "max_position_embeddings": 512,
    "eos_token_id": 2,
}


def test_model_info_unions_all_eos_ids(tmp_path: Path) -> None:
    """generation_config.json first, then config.json, then the tokenizer's eos_token."""
    folder = write_config(tmp_path, BASE, {"eos_token_id": [7, 2, 9]})
    write_tokenizer(folder, eos_token="t11")
    info = ModelInfo.from_model_dir(str(folder), max_model_len=None)
    assert info.eos_token_ids == [7, 2, 9, 11]
    assert (info.max_model_len, info.vocab_size, info.num_layers, info.num_kv_heads, info.head_dim) == (
        512,
        100,
        3,
        2,
        16,
    )


def test_model_info_without_generation_config_and_capped_length(tmp_path: Path) -> None:
    write_tokenizer(write_config(tmp_path, BASE))
    info = ModelInfo.from_model_dir(str(tmp_path), max_model_len=128)
    assert info.eos_token_ids == [2]
    assert info.max_model_len == 128
    with pytest.raises(ModelFolderError, match="max_model_len"):
        ModelInfo.from_model_dir(str(tmp_path), max_model_len=4096)


def test_model_info_without_a_tokenizer_names_the_eos_ids(tmp_path: Path) -> None:
    info = ModelInfo.from_model_dir(str(write_config(tmp_path, BASE)), max_model_len=None)  # shapes need no tokenizer
    assert info.vocab_size == 100
    with pytest.raises(ModelFolderError, match="cannot read the EOS ids"):
        _ = info.eos_token_ids


def test_default_model_info(model_dir: Path) -> None:
    info = ModelInfo.from_model_dir(str(model_dir), max_model_len=None)
    assert (info.num_layers, info.num_kv_heads, info.head_dim, info.vocab_size) == (30, 3, 64, 49152)
    # the engine and the text stages stop on the same ids: <|im_end|>, id 2
    assert info.eos_token_ids == list(load_tokenizer_info(model_dir).eos_token_ids) == [2]


def test_unsupported_architecture_is_refused(tmp_path: Path) -> None:
    folder = write_config(tmp_path, {**BASE, "architectures": ["GPT2LMHeadModel"]})
    with pytest.raises(ModelFolderError, match="GPT2LMHeadModel"):
        ModelRunner(EngineConfig(model_dir=str(folder)))


def test_missing_weights_are_refused(tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    folder = save_tiny(tmp_path / "m", "llama")
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ModelFolderError, match="missing"):
        ModelRunner(EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=256))


def test_wrong_shape_is_refused(tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "m", "llama")
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 96
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match="shape"):
        ModelRunner(EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=256))


def test_unsupported_rope_type_is_refused(tmp_path: Path) -> None:
    folder = save_tiny(tmp_path / "m", "llama")
    config = json.loads((folder / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFolderError, match="rope_type"):
        ModelRunner(EngineConfig(model_dir=str(folder), max_tokens_in_paged_kv_cache=256))
