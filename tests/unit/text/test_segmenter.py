from __future__ import annotations

import pytest

from contract.errors import InvalidInputError
from ensemble.outbound.segmenter import Segmenter, SegmentMode


def _segments(mode: SegmentMode, chunks: list[str]) -> list[str]:
    segmenter = Segmenter(mode)
    out = [segmenter.push(c) for c in chunks] + [segmenter.flush()]
    return [s for s in out if s]


def test_token_mode_passes_every_chunk_through() -> None:
    assert _segments(SegmentMode.TOKEN, ["Hel", "lo", "."]) == ["Hel", "lo", "."]


def test_sentence_mode_emits_whole_sentences() -> None:
    chunks = ["Hello", " world", ". How", " are", " you? I", "'m fine", "!"]
    assert _segments(SegmentMode.SENTENCE, chunks) == ["Hello world.", " How are you?", " I'm fine!"]


def test_sentence_mode_cjk_needs_no_space_and_keeps_closing_quotes() -> None:
    chunks = ["你好", "。今天", "天气很好！", "他说：「走吧。", "」然后", "走了"]
    assert _segments(SegmentMode.SENTENCE, chunks) == ["你好。", "今天天气很好！", "他说：「走吧。」", "然后走了"]


def test_sentence_mode_does_not_split_decimals_or_abbreviation_dots_without_space() -> None:
    assert _segments(SegmentMode.SENTENCE, ["Pi is 3", ".14 and e", ".g.x is", " odd. Yes"]) == [
        "Pi is 3.14 and e.g.x is odd.",
        " Yes",
    ]


def test_sentence_mode_ends_a_sentence_at_a_blank_line() -> None:
    assert _segments(SegmentMode.SENTENCE, ["# Title\n", "\nBody"]) == ["# Title\n\n", "Body"]


def test_paragraph_mode_waits_for_a_blank_line() -> None:
    chunks = ["First line. Second", " line.\n", "\nNext para", "graph.\n \n", "Last"]
    assert _segments(SegmentMode.PARAGRAPH, chunks) == ["First line. Second line.\n\n", "Next paragraph.\n \n", "Last"]


@pytest.mark.parametrize("mode", list(SegmentMode))
def test_nothing_is_lost_in_any_mode(mode: SegmentMode) -> None:
    text = "One. Two!\n\n三。四？Five"
    for cut in range(len(text) + 1):
        assert "".join(_segments(mode, [text[:cut], text[cut:]])) == text


def test_parse_accepts_the_three_modes_and_defaults_to_token() -> None:
    assert SegmentMode.parse("Sentence") is SegmentMode.SENTENCE
    assert SegmentMode.parse("") is SegmentMode.TOKEN
    assert SegmentMode.parse(None) is SegmentMode.TOKEN
    with pytest.raises(InvalidInputError, match=r"^segment: must be one of token, sentence, paragraph"):
        SegmentMode.parse("word")
