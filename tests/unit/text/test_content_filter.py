from __future__ import annotations

import json
from pathlib import Path

import pytest

from ensemble.outbound.content_filter import ContentFilterRules, FilterAction, FilterRule


def _run(rules: ContentFilterRules, chunks: list[str]) -> tuple[str, bool, str | None]:
    content_filter = rules.new_filter()
    out = []
    for chunk in chunks:
        result = content_filter.push(chunk)
        out.append(result.text)
        if result.stopped:
            return "".join(out), True, result.rule
    out.append(content_filter.flush().text)
    return "".join(out), False, None


MASK_DANGER = ContentFilterRules([FilterRule("危险")])


def test_word_split_across_tokens_is_masked() -> None:
    assert _run(MASK_DANGER, ["这很", "危", "险！"]) == ("这很**！", False, None)


def test_only_the_possible_start_of_a_word_is_held_back() -> None:
    content_filter = MASK_DANGER.new_filter()
    assert content_filter.push("这很危").text == "这很"  # "危" may start "危险"
    assert content_filter.push("机").text == "危机"  # it did not
    assert content_filter.flush().text == ""


def test_stop_rule_ends_the_response_before_the_word() -> None:
    rules = ContentFilterRules([FilterRule("bomb", action=FilterAction.STOP, name="weapons")])
    text, stopped, rule = _run(rules, ["How to build a bo", "mb at home"])
    assert (text, stopped, rule) == ("How to build a ", True, "weapons")


def test_regex_rule_masks_a_number_that_arrives_in_pieces() -> None:
    rules = ContentFilterRules([FilterRule(r"\d{3}-\d{4}", is_regex=True, name="phone")])
    assert _run(rules, ["call 55", "5-12", "34 now"]) == ("call ******** now", False, None)


def test_regex_match_touching_the_end_waits_for_more_text() -> None:
    rules = ContentFilterRules([FilterRule(r"\d+", is_regex=True)])
    assert _run(rules, ["id 12", "34 ok"]) == ("id **** ok", False, None)


def test_words_are_case_insensitive_unless_told_otherwise() -> None:
    rules = ContentFilterRules([FilterRule("Secret"), FilterRule("KEY", ignore_case=False)])
    assert _run(rules, ["my SECRET key and KEY"]) == ("my ****** key and ***", False, None)


def test_mask_and_stop_rules_together_mask_text_before_the_stop() -> None:
    rules = ContentFilterRules.from_dicts([{"pattern": "危险"}, {"pattern": "炸弹", "action": "stop"}])
    assert _run(rules, ["危险的", "炸", "弹在这"]) == ("**的", True, "炸弹")


def test_hold_back_is_bounded_for_open_ended_patterns() -> None:
    rules = ContentFilterRules([FilterRule(r"<secret>.*</secret>", is_regex=True)], max_hold_chars=16)
    content_filter = rules.new_filter()
    released = content_filter.push("<secret>" + "x" * 40).text
    assert len(released) == 48 - 16


def test_rules_load_from_a_json_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.json"
    path.write_text(json.dumps({"rules": [{"pattern": "危险", "action": "stop", "name": "danger"}]}), "utf-8")
    rules = ContentFilterRules.from_json_file(path)
    assert _run(rules, ["小心危", "险"]) == ("小心", True, "danger")


@pytest.mark.parametrize(
    "item, message",
    [
        ({"pattern": ""}, "non-empty pattern"),
        ({"pattern": "a*", "regex": True}, "matches the empty string"),
        ({"pattern": "(", "regex": True}, "bad regular expression"),
        ({"pattern": "x", "action": "delete"}, "delete"),
        ({"pattern": "x", "colour": "red"}, "unknown keys"),
    ],
)
def test_bad_rules_are_rejected_at_load_time(item: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ContentFilterRules.from_dicts([item])


def test_any_chunking_gives_the_same_output() -> None:
    rules = ContentFilterRules.from_dicts([{"pattern": "危险"}, {"pattern": r"\bbad\w*", "regex": True}])
    text = "这是危险的 badly bad 危 险 ok"
    expected = _run(rules, [text])
    for cut in range(len(text) + 1):
        for cut2 in range(cut, len(text) + 1):
            assert _run(rules, [text[:cut], text[cut:cut2], text[cut2:]]) == expected


class _ScannedLengths:
    """Wraps a compiled pattern and records how much text each scan covers."""

    def __init__(self, pattern: object, lengths: list[int]) -> None:
        self._pattern = pattern
        self._lengths = lengths

    def finditer(self, text: str, *args: object, **kwargs: object) -> object:
        self._lengths.append(len(text))
        return self._pattern.finditer(text, *args, **kwargs)  # type: ignore[attr-defined]

    def search(self, text: str, *args: object, **kwargs: object) -> object:
        self._lengths.append(len(text))
        return self._pattern.search(text, *args, **kwargs)  # type: ignore[attr-defined]


def test_each_push_scans_at_most_the_hold_window_plus_the_new_text() -> None:
    """The per-token cost does not grow with the response: every scan covers
    at most `max_hold_chars` of held text plus the new token, even under an
    open-ended pattern that could hold forever. (Its speed in microseconds is
    a benchmark's business, not a unit test's.)"""
    words = [{"pattern": w} for w in ("危险", "炸弹", "暴力", "password", "secret", "kill", "attack")]
    regexes = [
        {"pattern": p, "regex": True}
        for p in (r"\d{3}-\d{4}", r"\b[\w.]+@\w+\.\w+\b", r"(?:api|key)=\w+", r"<private>.*</private>")
    ]
    stop = [{"pattern": "绝密", "action": "stop"}]
    rules = ContentFilterRules.from_dicts(words * 3 + regexes + stop)
    lengths: list[int] = []
    rules.mask_pattern = _ScannedLengths(rules.mask_pattern, lengths)  # type: ignore[assignment]
    rules.stop_pattern = _ScannedLengths(rules.stop_pattern, lengths)  # type: ignore[assignment]
    tokens = ["The", " quick", " brown", " fox", "，", "今天", "天气", "很好", "。", " email", " me"] * 100
    tokens += ["<private>"] + ["xxxx"] * 100  # never closed: held up to the window, then given up

    text, stopped, _ = _run(rules, tokens)
    assert not stopped and text == "".join(tokens)
    assert rules.max_hold_chars == 64
    assert max(lengths) == 64 + len("xxxx")
