"""Property tests: streaming deltas of the real default tokenizer (byte-level
BPE) and of a trained SentencePiece tokenizer reassemble exactly into the full
decode, for any split of the ids into chunks, and never show U+FFFD early."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from ensemble.outbound.detokenizer import IncrementalDetokenizer
from tests.unit.text.spm_tokenizer import RARE_CHINESE

SAMPLE_TEXTS = [
    "你好，世界！今天天气很好。",
    "危险品请勿靠近",
    "emoji 😀🎉👍🏽 and 🇫🇷 flags",
    "naïve café – “quotes” …",
    "日本語のテキスト、かな。",
    "한국어 문장입니다",
    "mixed 中文 and English words 混合",
    "Ünïcödé ß ∑ ∫ √",
    f"rare {RARE_CHINESE} chars",
    "the quick brown fox jumps over the lazy dog. streaming tokens arrive",
]
REPLACEMENT = "\ufffd"
HYPOTHESIS = settings(
    max_examples=int(os.environ.get("TEXT_HYPOTHESIS_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


def _byte_piece_ids(tokenizer: Tokenizer) -> dict[int, int]:
    """SentencePiece byte-fallback pieces: byte value → id ({} for byte-level BPE)."""
    ids = {value: tokenizer.token_to_id(f"<0x{value:02X}>") for value in range(256)}
    return {value: token_id for value, token_id in ids.items() if token_id is not None}


def _interesting_ids(tokenizer: Tokenizer, excluded: set[int]) -> list[int]:
    """Ids whose own decode is non-ASCII or an incomplete byte run (CJK and
    emoji pieces of byte-level BPE)."""
    size = tokenizer.get_vocab_size()
    texts = tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
    return [i for i, text in enumerate(texts) if not text.isascii() and i not in excluded]


def _token_sequences(tokenizer: Tokenizer) -> st.SearchStrategy[list[int]]:
    size = tokenizer.get_vocab_size()
    byte_pieces = _byte_piece_ids(tokenizer)
    byte_ids = set(byte_pieces.values())
    interesting = _interesting_ids(tokenizer, byte_ids)
    specials = sorted(tokenizer.get_added_tokens_decoder())
    real = [tokenizer.encode(t, add_special_tokens=False).ids for t in SAMPLE_TEXTS]
    single_id = st.one_of(
        st.sampled_from(interesting),  # CJK / emoji pieces, any order
        st.integers(0, size - 1).filter(lambda i: i not in byte_ids),  # anything at all
        st.sampled_from(specials),  # must vanish from the text
    )
    if byte_pieces:
        # ByteFallback decodes a run of byte pieces all-or-nothing (one bad
        # byte turns the whole run into U+FFFD), so a full decode is no
        # reference for invalid runs: here byte pieces come as whole
        # characters only; the invalid case has its own test below.
        real_slice = st.sampled_from(SAMPLE_TEXTS).flatmap(
            lambda text: st.tuples(st.integers(0, len(text)), st.integers(0, len(text))).map(
                lambda ab: tokenizer.encode(text[min(ab) : max(ab)], add_special_tokens=False).ids
            )
        )
    else:  # byte-level BPE: any slice of ids, cutting characters anywhere
        real_slice = st.sampled_from(real).flatmap(
            lambda ids: st.tuples(st.integers(0, len(ids)), st.integers(0, len(ids))).map(
                lambda ab: ids[min(ab) : max(ab)]
            )
        )
    pieces = [real_slice, st.lists(single_id, min_size=1, max_size=4)]
    if byte_pieces:
        pieces.append(
            st.characters(min_codepoint=0x80, exclude_categories=["Cs"]).map(
                lambda char: [byte_pieces[b] for b in char.encode("utf-8")]
            )
        )
    return st.lists(st.one_of(pieces), min_size=1, max_size=6).map(lambda parts: [t for p in parts for t in p])


def _stream(tokenizer: Tokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < len(ids))), len(ids)]
    deltas = [detokenizer.push(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    deltas.append(detokenizer.flush())
    return deltas


def _check_stream(tokenizer: Tokenizer, ids: list[int], cuts: list[int]) -> None:
    full = tokenizer.decode(ids, skip_special_tokens=True)
    deltas = _stream(tokenizer, ids, cuts)
    assert "".join(deltas) == full
    position = 0
    for delta in deltas:
        for offset, char in enumerate(delta):
            if char == REPLACEMENT:
                assert full[position + offset] == REPLACEMENT
        position += len(delta)


def _check_valid_text_is_never_held_longer_than_needed(tokenizer: Tokenizer, ids: list[int]) -> None:
    """For ids of real text, after every token the emitted text reaches at
    least the last token boundary where the text was whole, and at most the
    decode so far without its unfinished trailing character: nothing else is
    ever held back."""
    detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=True)
    emitted = ""
    whole_so_far = ""
    for k in range(1, len(ids) + 1):
        delta = detokenizer.push(ids[k - 1 : k])
        assert REPLACEMENT not in delta
        emitted += delta
        decoded = tokenizer.decode(ids[:k], skip_special_tokens=True)
        if not decoded.endswith(REPLACEMENT):
            whole_so_far = decoded
        # (ByteFallback shows a run with an unfinished character as all U+FFFD,
        # so the whole text at an earlier boundary can be the longer bound.)
        upper = max(whole_so_far, decoded.rstrip(REPLACEMENT), key=len)
        assert emitted.startswith(whole_so_far) and upper.startswith(emitted)


@pytest.fixture(scope="module", params=["byte_level_bpe", "sentencepiece"])
def any_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    return request.getfixturevalue("tokenizer" if request.param == "byte_level_bpe" else "spm_tokenizer")


@pytest.fixture(scope="module")
def sequences(any_tokenizer: Tokenizer) -> st.SearchStrategy[list[int]]:
    return _token_sequences(any_tokenizer)


@HYPOTHESIS
@given(data=st.data())
def test_deltas_reassemble_the_full_decode_for_any_chunking(
    any_tokenizer: Tokenizer, sequences: st.SearchStrategy[list[int]], data: st.DataObject
) -> None:
    ids = data.draw(sequences, label="ids")
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)), label="cuts")
    _check_stream(any_tokenizer, ids, cuts)
    _check_stream(any_tokenizer, ids, list(range(len(ids))))  # one id per push: a cut at every point
    _check_stream(any_tokenizer, ids, [])  # everything in one push


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_real_text_streams_without_replacement_characters(any_tokenizer: Tokenizer, text: str) -> None:
    ids = any_tokenizer.encode(text, add_special_tokens=False).ids
    _check_valid_text_is_never_held_longer_than_needed(any_tokenizer, ids)
    assert "".join(_stream(any_tokenizer, ids, list(range(len(ids))))) == any_tokenizer.decode(ids)


def test_sentencepiece_fixture_reproduces_the_missing_space_bug(spm_tokenizer: Tokenizer) -> None:
    """The naive per-token decode (what the reports complain about) loses the
    spaces with this tokenizer, so the tests above really exercise the fix."""
    ids = spm_tokenizer.encode("the quick brown fox", add_special_tokens=False).ids
    naive = "".join(spm_tokenizer.decode([i]) for i in ids)
    assert naive == "thequickbrownfox"
    assert "".join(_stream(spm_tokenizer, ids, list(range(len(ids))))) == "the quick brown fox"


def test_truncated_byte_fallback_run_keeps_the_characters_already_streamed(spm_tokenizer: Tokenizer) -> None:
    """ "，" (3 byte pieces) then one stray byte: a full decode turns the whole
    run into U+FFFD; the stream has shown "，" already and must not take it
    back, so the stray byte alone ends up as U+FFFD."""
    byte_ids = [spm_tokenizer.token_to_id(f"<0x{b:02X}>") for b in "，".encode() + b"\xe6"]
    ids = spm_tokenizer.encode("你好", add_special_tokens=False).ids + byte_ids
    deltas = _stream(spm_tokenizer, ids, list(range(len(ids))))
    streamed = "".join(deltas)
    assert streamed.startswith("你好，")
    assert streamed[len("你好，") :] and set(streamed[len("你好，") :]) == {REPLACEMENT}


def test_special_tokens_never_reach_the_text(tokenizer: Tokenizer) -> None:
    eos = tokenizer.token_to_id("<|im_end|>")
    ids = tokenizer.encode("Paris", add_special_tokens=False).ids + [eos]
    detokenizer = IncrementalDetokenizer(tokenizer)
    assert detokenizer.push(ids) + detokenizer.flush() == "Paris"
    keep = IncrementalDetokenizer(tokenizer, skip_special_tokens=False)
    assert keep.push(ids) + keep.flush() == "Paris<|im_end|>"


def test_work_per_token_stays_bounded(tokenizer: Tokenizer) -> None:
    """The decode window never grows with the output: after a long stream the
    detokenizer keeps only the last few ids."""
    ids = tokenizer.encode(" ".join(SAMPLE_TEXTS) * 20, add_special_tokens=False).ids
    detokenizer = IncrementalDetokenizer(tokenizer)
    longest_window = 0
    for token_id in ids:
        detokenizer.push([token_id])
        longest_window = max(longest_window, len(detokenizer._ids))
    assert len(ids) == 3840
    # a whole-character boundary is never far back, so the window holds the
    # few ids since the last one and never grows with the output
    assert longest_window == 5
