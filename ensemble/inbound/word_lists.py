"""``stop_words`` / ``bad_words`` strings ↔ TensorRT-LLM's ``[2, N]`` INT32
word-list tensors (row 0: every word's ids concatenated; row 1: cumulative end
offsets, padded with -1; row 0 is padded with 0).

The engine matches these at token level, and a word's tokens depend on what
precedes it: byte-level BPE spells "User" after a space as one token ("ĠUser")
and after a newline as another ("User"). Each word therefore contributes every
distinct spelling it can have mid-text; the text stages still catch any
spelling missed here by matching the decoded text.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from tokenizers import Tokenizer

from contract.errors import InvalidInputError
from contract.public_bounds import validate_words

# Contexts a word can follow mid-text; the context's own tokens are cut off again.
_CONTEXTS = ("", " ", "\n")


def word_spellings(word: str, tokenizer: Tokenizer) -> list[list[int]]:
    """Distinct token sequences ``word`` can appear as in the middle of a text."""
    spellings: list[list[int]] = []
    for context in _CONTEXTS:
        context_ids = tokenizer.encode(context, add_special_tokens=False).ids if context else []
        ids = tokenizer.encode(context + word, add_special_tokens=False).ids
        if context and context_ids and ids[: len(context_ids)] == context_ids:
            ids = ids[len(context_ids) :]  # the word's own tokens after the context
        elif context and context != " ":
            continue  # context merged with the word's first token: no clean spelling to take
        if ids and ids not in spellings:
            spellings.append(ids)
    return spellings


def to_word_list(token_sequences: Sequence[Sequence[int]]) -> np.ndarray:
    """TensorRT-LLM's ``[2, N]`` INT32 layout for already tokenized words."""
    flat: list[int] = []
    offsets: list[int] = []
    for sequence in token_sequences:
        if not sequence:
            raise ValueError("a word list entry has no tokens")
        flat.extend(int(t) for t in sequence)
        offsets.append(len(flat))
    width = max(1, len(flat), len(offsets))
    out = np.zeros((2, width), dtype=np.int32)
    out[1, :] = -1
    out[0, : len(flat)] = flat
    out[1, : len(offsets)] = offsets
    return out


def encode_word_list(field: str, words: Sequence[str] | None, tokenizer: Tokenizer) -> np.ndarray | None:
    """A request's ``stop_words`` / ``bad_words`` as the LLM step's word-list
    tensor, or None when there are none (the optional input is then left out)."""
    checked = validate_words(field, words)
    if not checked:
        return None
    sequences: list[list[int]] = []
    for word in checked:
        for ids in word_spellings(word, tokenizer):
            if ids not in sequences:
                sequences.append(ids)
    return to_word_list(sequences)


def parse_word_list(field: str, array: np.ndarray | None) -> list[list[int]]:
    """The inverse of ``to_word_list``: ``[2, N]`` (or ``[1, 2, N]``) → token
    sequences. The LLM step reads its `stop_words_list` / `bad_words_list` with it."""
    if array is None:
        return []
    values = np.asarray(array)
    if values.size == 0:
        return []
    if values.ndim == 3 and values.shape[0] == 1:  # the batch dimension of max_batch_size
        values = values[0]
    if values.ndim != 2 or values.shape[0] != 2:
        raise InvalidInputError(field, f"must have shape [2, N] (ids, offsets), got {list(values.shape)}")
    if not np.issubdtype(values.dtype, np.integer):
        raise InvalidInputError(field, f"must be integers, got {values.dtype}")
    ids, offsets = values[0].tolist(), values[1].tolist()
    sequences: list[list[int]] = []
    start = 0
    for end in offsets:
        if end == -1:
            break
        if end <= start or end > len(ids):
            raise InvalidInputError(field, f"offsets must increase and stay within {len(ids)} ids, got {offsets}")
        sequence = ids[start:end]
        if any(token < 0 for token in sequence):
            raise InvalidInputError(field, "token ids must not be negative")
        sequences.append(sequence)
        start = end
    return sequences
