from __future__ import annotations

import json
import shutil
from pathlib import Path

from ensemble.tokenizer_info import TokenizerInfo, load_tokenizer_info


def test_default_model_facts(tokenizer_info: TokenizerInfo) -> None:
    assert tokenizer_info.eos_token_ids == (2,)
    assert tokenizer_info.tokenizer.id_to_token(2) == "<|im_end|>"
    assert tokenizer_info.end_id == 2 and tokenizer_info.pad_id == 2
    assert tokenizer_info.max_context == 8192
    assert tokenizer_info.chat_template is not None and "<|im_start|>" in tokenizer_info.chat_template
    # the 17 added special tokens: <|endoftext|>, <|im_start|>, <|im_end|>, then 14 more
    assert tokenizer_info.special_token_ids == frozenset(range(17))


def test_loading_is_cached_per_folder(text_model_dir: Path, tokenizer_info: TokenizerInfo) -> None:
    assert load_tokenizer_info(text_model_dir) is tokenizer_info
    assert load_tokenizer_info(str(text_model_dir) + "/") is tokenizer_info


def _model_copy(source: Path, target: Path, **files: object) -> Path:
    target.mkdir()
    shutil.copy(source / "tokenizer.json", target / "tokenizer.json")
    for name, content in files.items():
        (target / f"{name}.json").write_text(json.dumps(content), encoding="utf-8")
    return target


def test_eos_ids_merge_generation_config_config_and_tokenizer(text_model_dir: Path, tmp_path: Path) -> None:
    folder = _model_copy(
        text_model_dir,
        tmp_path / "m",
        generation_config={"eos_token_id": [5, 7]},
        config={"eos_token_id": 7, "n_positions": 1024},
        tokenizer_config={
            "eos_token": {"content": "<|im_end|>"},
            "chat_template": [{"name": "default", "template": "T"}, {"name": "tool_use", "template": "U"}],
        },
    )
    info = load_tokenizer_info(folder)
    assert info.eos_token_ids == (5, 7, 2)  # generation_config first: it names the chat model's stop
    assert info.end_id == 5
    assert info.max_context == 1024
    assert info.chat_template == "T"


def test_folder_without_configs_still_loads(text_model_dir: Path, tmp_path: Path) -> None:
    info = load_tokenizer_info(_model_copy(text_model_dir, tmp_path / "bare"))
    assert info.eos_token_ids == () and info.chat_template is None and info.max_context is None
