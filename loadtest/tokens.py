"""Output tokens counted by re-tokenizing the returned text, as genai-perf does,
so every server (and both transports) is measured by the same ruler."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer


class TokenCounter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    @classmethod
    def from_model_dir(cls, model_dir: str | Path | None = None) -> TokenCounter:
        if not model_dir:
            from serving.default_model import resolve_model_dir

            model_dir = resolve_model_dir()
        path = Path(model_dir) / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{path} not found: pass the model folder holding tokenizer.json")
        return cls(Tokenizer.from_file(str(path)))

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids) if text else 0
