from __future__ import annotations

import pytest

from ensemble.outbound.stop_strings import StopStringMatcher


def _run(stops: list[str], chunks: list[str]) -> tuple[list[str], bool]:
    matcher = StopStringMatcher(stops)
    out = []
    for chunk in chunks:
        result = matcher.push(chunk)
        out.append(result.text)
        if result.stopped:
            return out, True
    out.append(matcher.flush().text)
    return out, False


def test_stop_string_split_over_chunks_is_caught_and_never_emitted() -> None:
    out, stopped = _run(["User:"], ["Hello", " there\nUs", "er", ": more"])
    assert stopped
    assert "".join(out) == "Hello there\n"
    assert "Us" not in "".join(out)


def test_partial_match_is_held_then_released_when_it_cannot_match() -> None:
    matcher = StopStringMatcher(["User:"])
    assert matcher.push("a Us").text == "a "  # "Us" may become "User:"
    assert matcher.push("e").text == ""  # "Use" still may
    assert matcher.push("d it").text == "Used it"  # "Used" cannot: released
    assert matcher.flush().text == ""


def test_held_tail_is_released_at_the_end_of_the_stream() -> None:
    out, stopped = _run(["</answer>"], ["done </ans"])
    assert not stopped
    assert out == ["done ", "</ans"]


def test_earliest_of_several_stop_strings_wins() -> None:
    out, stopped = _run(["END", "\n\n", "###"], ["one ## two\n", "\nthree END"])
    assert stopped
    assert "".join(out) == "one ## two"


def test_overlapping_prefixes_hold_only_what_can_still_match() -> None:
    matcher = StopStringMatcher(["abcd", "bce"])
    assert matcher.push("xab").text == "x"  # "ab" prefixes "abcd"
    assert matcher.push("c").text == ""  # "abc" / "bc" still live
    result = matcher.push("e")  # "bce" completes
    assert result.stopped and result.text == "a"  # "x" went out on the first push


def test_stop_at_the_very_start_emits_nothing_and_stays_stopped() -> None:
    matcher = StopStringMatcher(["<stop>"])
    assert matcher.push("<stop> tail").text == ""
    assert matcher.stopped
    assert matcher.push("more").text == "" and matcher.flush().stopped


@pytest.mark.parametrize("text", ["你好危险的世界", "plain text without stops"])
def test_any_chunking_gives_the_same_result(text: str) -> None:
    stops = ["危险", "without"]
    expected = text[: min(i for i in (text.find(s) for s in stops) if i >= 0)]
    for cut in range(len(text) + 1):
        out, stopped = _run(stops, [text[:cut], text[cut:]])
        assert stopped and "".join(out) == expected


def test_no_stop_strings_passes_text_through() -> None:
    matcher = StopStringMatcher([])
    assert matcher.push("User:").text == "User:"
