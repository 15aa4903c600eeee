"""Everything the text stages need to know about a model's tokenizer, read
once per model folder: the fast tokenizer, every EOS id, the chat template and
the context length.

Chat models often stop on a token that is not the tokenizer's ``eos_token``
(``<|eot_id|>``, ``<|im_end|>``): their list lives in generation_config.json,
so all three sources (generation_config.json, config.json, the tokenizer's
``eos_token``) are merged. Stopping on the tokenizer's ``eos_token`` alone lets
such a model write past the end of its turn, inventing the next one, until
``max_tokens``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# config.json keys that name the context length, most specific first.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length")
# tokenizer_config.json sets model_max_length to ~1e30 when it means "no limit".
_NO_LIMIT = 10**9


# eq=False: compared and hashed by identity (it holds a tokenizer and a dict).
@dataclass(frozen=True, eq=False)
class TokenizerInfo:
    model_dir: Path
    tokenizer: Tokenizer
    eos_token_ids: tuple[int, ...]
    # bos_token, eos_token, pad_token, unk_token as strings, for chat templates.
    special_tokens: dict[str, str] = field(default_factory=dict)
    special_token_ids: frozenset[int] = frozenset()
    chat_template: str | None = None
    max_context: int | None = None

    @property
    def end_id(self) -> int:
        """The single end id the LLM step's ``end_id`` input takes."""
        if not self.eos_token_ids:
            raise ValueError(f"{self.model_dir}: the tokenizer declares no EOS token")
        return self.eos_token_ids[0]

    @property
    def pad_id(self) -> int:
        pad = self.special_tokens.get("pad_token")
        pad_id = self.tokenizer.token_to_id(pad) if pad else None
        return self.end_id if pad_id is None else pad_id


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def _ids(value: Any) -> list[int]:
    """``eos_token_id`` is an int in some configs and a list in others."""
    if value is None:
        return []
    if isinstance(value, bool):
        raise ValueError(f"eos_token_id must be an int or a list of ints, not {value!r}")
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return list(value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, not {value!r}")


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes a special token as a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    content = value.get("content") if isinstance(value, dict) else None
    return content if isinstance(content, str) else None


def _chat_template(model_dir: Path, tokenizer_config: dict[str, Any]) -> str | None:
    # transformers 5 saves the template to its own file, which then wins.
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return jinja_file.read_text(encoding="utf-8")
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": ..., "template": ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


def _max_context(config: dict[str, Any], tokenizer_config: dict[str, Any]) -> int | None:
    for key in _CONTEXT_KEYS:
        value = config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    value = tokenizer_config.get("model_max_length")
    if isinstance(value, (int, float)) and 0 < value < _NO_LIMIT:
        return int(value)
    return None


def _load_tokenizer(model_dir: Path) -> Tokenizer:
    tokenizer_file = model_dir / "tokenizer.json"
    if tokenizer_file.is_file():
        return Tokenizer.from_file(str(tokenizer_file))
    # Folders with only a slow (SentencePiece) tokenizer: let transformers convert it.
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(model_dir))
    backend = getattr(hf, "backend_tokenizer", None)
    if not isinstance(backend, Tokenizer):
        raise ValueError(f"{model_dir}: no tokenizer.json and no fast tokenizer could be built")
    return backend


@functools.lru_cache(maxsize=8)
def _load_cached(model_dir: str) -> TokenizerInfo:
    path = Path(model_dir)
    config = _read_json(path / "config.json")
    generation_config = _read_json(path / "generation_config.json")
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    tokenizer = _load_tokenizer(path)

    special_tokens = {
        name: text
        for name in ("bos_token", "eos_token", "pad_token", "unk_token")
        if (text := _token_text(tokenizer_config.get(name))) is not None
    }
    eos_ids: list[int] = []
    candidates = _ids(generation_config.get("eos_token_id")) + _ids(config.get("eos_token_id"))
    eos_text = special_tokens.get("eos_token")
    if eos_text is not None and (eos_text_id := tokenizer.token_to_id(eos_text)) is not None:
        candidates.append(eos_text_id)
    for token_id in candidates:  # keep first-seen order: generation_config's first id is the main one
        if token_id not in eos_ids:
            eos_ids.append(token_id)

    special_ids = frozenset(
        token_id for token_id, added in tokenizer.get_added_tokens_decoder().items() if added.special
    )
    info = TokenizerInfo(
        model_dir=path,
        tokenizer=tokenizer,
        eos_token_ids=tuple(eos_ids),
        special_tokens=special_tokens,
        special_token_ids=special_ids,
        chat_template=_chat_template(path, tokenizer_config),
        max_context=_max_context(config, tokenizer_config),
    )
    log.info(
        "tokenizer loaded",
        extra={
            "model_dir": str(path),
            "eos_token_ids": info.eos_token_ids,
            "max_context": info.max_context,
            "has_chat_template": info.chat_template is not None,
        },
    )
    return info


def load_tokenizer_info(model_dir: str | os.PathLike[str]) -> TokenizerInfo:
    """Read a Hugging Face model folder's tokenizer facts; cached per folder."""
    path = Path(model_dir).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"model folder {path} does not exist")
    return _load_cached(str(path))
