from __future__ import annotations

import numpy as np
import pytest
from tokenizers import Tokenizer

from contract.errors import InvalidInputError
from contract.public_bounds import validate_words
from ensemble.inbound.word_lists import encode_word_list, parse_word_list, to_word_list, word_spellings


def _contains(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i : i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def test_layout_is_tensorrt_llm_ids_row_and_offsets_row() -> None:
    array = to_word_list([[10, 11], [12], [13, 14, 15]])
    assert array.dtype == np.int32
    assert array.tolist() == [[10, 11, 12, 13, 14, 15], [2, 3, 6, -1, -1, -1]]


def test_parse_is_the_inverse_and_accepts_a_batch_dimension() -> None:
    words = [[5], [6, 7, 8], [9, 9]]
    assert parse_word_list("stop_words_list", to_word_list(words)) == words
    assert parse_word_list("stop_words_list", to_word_list(words)[None]) == words
    assert parse_word_list("stop_words_list", to_word_list([])) == []
    assert parse_word_list("stop_words_list", None) == []


@pytest.mark.parametrize(
    "array, message",
    [
        (np.zeros((3, 2), np.int32), r"^bad_words_list: must have shape \[2, N\]"),
        (np.array([[1, 2], [3, -1]], np.int32), r"^bad_words_list: offsets must increase"),
        (np.array([[1, 2], [2, 1]], np.int32), r"^bad_words_list: offsets must increase"),
        (np.array([[1, -4], [2, -1]], np.int32), r"^bad_words_list: token ids must not be negative"),
        (np.array([[1.0], [1.0]]), r"^bad_words_list: must be integers"),
    ],
)
def test_malformed_word_lists_are_rejected(array: np.ndarray, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_word_list("bad_words_list", array)


@pytest.mark.parametrize("context", ["Hello\n{}", "Hello {}", "{} at the start", "said:{}"])
def test_some_spelling_of_a_stop_word_occurs_in_the_text_wherever_it_stands(tokenizer: Tokenizer, context: str) -> None:
    spellings = word_spellings("User:", tokenizer)
    text_ids = tokenizer.encode(context.format("User:") + " more", add_special_tokens=False).ids
    assert any(_contains(text_ids, s) for s in spellings)


def test_spellings_of_the_default_tokenizer_cover_both_space_variants(tokenizer: Tokenizer) -> None:
    spellings = word_spellings("User", tokenizer)
    texts = {tokenizer.decode(s) for s in spellings}
    assert texts == {"User", " User"}


def test_encode_word_list_round_trips_through_parse(tokenizer: Tokenizer) -> None:
    array = encode_word_list("stop_words", ["User:", "危险"], tokenizer)
    assert array is not None and array.shape[0] == 2
    sequences = parse_word_list("stop_words_list", array)
    decoded = [tokenizer.decode(s) for s in sequences]
    assert any("User:" in d for d in decoded) and any("危险" in d for d in decoded)
    assert len(sequences) == len(set(map(tuple, sequences)))
    assert encode_word_list("stop_words", [], tokenizer) is None


@pytest.mark.parametrize(
    "words, message",
    [
        ("User:", r"^stop_words: must be a list of strings"),
        (["ok", ""], r"^stop_words: item 1 is empty"),
        (["ok", 3], r"^stop_words: item 1 is not a string"),
        (["x"] * 65, r"^stop_words: 65 words; at most 64"),
        (["x" * 300], r"^stop_words: item 0 is longer than"),
    ],
)
def test_bad_word_inputs_name_the_field(words: object, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        validate_words("stop_words", words)  # type: ignore[arg-type]
