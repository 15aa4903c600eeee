"""Fixtures for the text stages: the default model's real tokenizer and a
tiny SentencePiece tokenizer trained on the spot (for the missing-space case)."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from ensemble.tokenizer_info import TokenizerInfo, load_tokenizer_info
from serving.default_model import ensure_default_model
from tests.unit.text.spm_tokenizer import train_sentencepiece_tokenizer


@pytest.fixture(scope="session")
def text_model_dir() -> Path:
    # Not named model_dir: tests/conftest.py owns that one.
    return ensure_default_model()


@pytest.fixture(scope="session")
def tokenizer_info(text_model_dir: Path) -> TokenizerInfo:
    return load_tokenizer_info(text_model_dir)


@pytest.fixture(scope="session")
def tokenizer(tokenizer_info: TokenizerInfo) -> Tokenizer:
    return tokenizer_info.tokenizer


@pytest.fixture(scope="session")
def spm_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Tokenizer:
    return train_sentencepiece_tokenizer(tmp_path_factory.mktemp("spm"))
