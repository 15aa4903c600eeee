from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from contract.errors import InvalidInputError
from ensemble.inbound.prompt import PromptBuilder, PromptConfig
from ensemble.tokenizer_info import TokenizerInfo

CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Answer in one word."}, {"role": "user", "content": "Capital of Japan?"}],
    [
        {"role": "user", "content": "你好，世界 😀"},
        {"role": "assistant", "content": "你好！"},
        {"role": "user", "content": "  spaces\nand\ttabs  "},
    ],
    [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "call a tool"},
        {"role": "assistant", "content": "ok"},
        {"role": "tool", "content": '{"temp": 21}'},
        {"role": "user", "content": "and now?"},
    ],
]


@pytest.fixture(scope="module")
def hf_tokenizer(text_model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(text_model_dir))


@pytest.fixture(scope="module")
def builder(tokenizer_info: TokenizerInfo) -> PromptBuilder:
    return PromptBuilder(tokenizer_info)


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_chat_prompt_equals_hugging_face_apply_chat_template(
    builder: PromptBuilder, hf_tokenizer: Any, messages: list[dict[str, str]]
) -> None:
    built = builder.build("", json.dumps(messages), max_tokens=16)
    expected = hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert built.input_ids == list(expected)
    assert built.from_messages and built.dropped_turns == 0
    assert builder.render(messages) == hf_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )


def test_plain_text_is_tokenized_as_is(builder: PromptBuilder, tokenizer_info: TokenizerInfo) -> None:
    built = builder.build("Hello 世界", None, max_tokens=8)
    assert built.input_ids == tokenizer_info.tokenizer.encode("Hello 世界").ids
    assert not built.from_messages and built.num_input_tokens == len(built.input_ids)


def test_default_system_prompt_is_added_only_when_the_chat_has_none(tokenizer_info: TokenizerInfo) -> None:
    builder = PromptBuilder(tokenizer_info, PromptConfig(default_system_prompt="Be brief."))
    assert builder.render([{"role": "user", "content": "hi"}]).startswith("<|im_start|>system\nBe brief.<|im_end|>")
    own = builder.render([{"role": "system", "content": "Mine."}, {"role": "user", "content": "hi"}])
    assert "Be brief." not in own and own.startswith("<|im_start|>system\nMine.")


def _long_chat(turns: int) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": "KEEP-SYSTEM"}]
    for i in range(turns):
        messages.append({"role": "user", "content": f"question {i} " + "words " * 20})
        messages.append({"role": "assistant", "content": f"answer {i} " + "more " * 20})
    messages.append({"role": "user", "content": "LAST-QUESTION"})
    return messages


def test_context_policy_drops_the_oldest_turns_and_keeps_system_and_last_user(tokenizer_info: TokenizerInfo) -> None:
    messages = _long_chat(turns=6)
    unlimited = PromptBuilder(tokenizer_info).build("", json.dumps(messages), max_tokens=50)
    context = unlimited.num_input_tokens // 2
    builder = PromptBuilder(tokenizer_info, max_context=context)
    built = builder.build("", json.dumps(messages), max_tokens=50)

    assert built.dropped_turns == 5
    assert built.num_input_tokens + 50 <= context
    text = tokenizer_info.tokenizer.decode(built.input_ids, skip_special_tokens=False)
    assert "KEEP-SYSTEM" in text and "LAST-QUESTION" in text
    assert "question 0 " not in text  # oldest turn went first
    assert "question 5 " in text  # the newest turn still fits
    kept = [messages[0], *messages[1 + 2 * built.dropped_turns :]]
    assert built.input_ids == tokenizer_info.tokenizer.encode(builder.render(kept), add_special_tokens=False).ids
    # Fewest turns dropped: keeping one more would not fit.
    one_more = [messages[0], *messages[1 + 2 * (built.dropped_turns - 1) :]]
    longer = tokenizer_info.tokenizer.encode(builder.render(one_more), add_special_tokens=False).ids
    assert len(longer) + 50 > context


def test_chat_that_cannot_fit_even_after_dropping_everything_names_messages(tokenizer_info: TokenizerInfo) -> None:
    builder = PromptBuilder(tokenizer_info, max_context=64)
    messages = _long_chat(turns=2)
    messages[-1]["content"] = "LAST " * 100
    with pytest.raises(
        InvalidInputError,
        match=r"^messages: prompt of \d+ tokens \(after dropping 2 earlier "
        r"turns\) \+ max_tokens 8 exceeds the context of 64$",
    ):
        builder.build("", json.dumps(messages), max_tokens=8)


def test_plain_text_too_long_is_an_error_naming_text_input(tokenizer_info: TokenizerInfo) -> None:
    builder = PromptBuilder(tokenizer_info, max_context=32)
    with pytest.raises(
        InvalidInputError,
        match=r"^text_input: prompt of 40 tokens \+ max_tokens 8 exceeds "
        r"the context of 32$",
    ):
        builder.build("hello" + " hello" * 39, None, max_tokens=8)


@pytest.mark.parametrize(
    "text_input, messages, max_tokens, expected",
    [
        ("", None, 8, r"^text_input: must not be empty"),
        ("\u0004\u0016", None, 8, r"^text_input: tokenizes to no tokens at all$"),
        (None, None, 8, r"^text_input: must not be empty"),
        ("hi", '[{"role": "user", "content": "hi"}]', 8, r"^text_input: must be empty when messages is given"),
        ("", "[{", 8, r"^messages: not valid JSON"),
        ("", '{"role": "user", "content": "hi"}', 8, r"^messages: must be a JSON array"),
        ("", "[]", 8, r"^messages: must not be empty"),
        ("", '["hi"]', 8, r"^messages: item 0 must be an object"),
        ("", '[{"role": "robot", "content": "hi"}]', 8, r"^messages: item 0 has role 'robot'"),
        ("", '[{"role": "user"}]', 8, r"^messages: item 0 \(user\) must have a string content"),
        ("", '[{"role": "user", "content": ["hi"]}]', 8, r"^messages: item 0 \(user\) must have a string content"),
        ("hi", None, 10**6, r"^max_tokens: 1000000 leaves no room"),
    ],
)
def test_every_input_error_names_its_field(
    builder: PromptBuilder, text_input: str | None, messages: str | None, max_tokens: int, expected: str
) -> None:
    with pytest.raises(InvalidInputError, match=expected):
        builder.build(text_input, messages, max_tokens)


def test_template_rejection_is_reported_against_messages(tokenizer_info: TokenizerInfo) -> None:
    strict = "{% if messages[0]['role'] != 'user' %}{{ raise_exception('first must be user') }}{% endif %}x"
    builder = PromptBuilder(dataclasses.replace(tokenizer_info, chat_template=strict))
    with pytest.raises(InvalidInputError, match=r"^messages: rejected by the model's chat template: first must"):
        builder.build("", '[{"role": "assistant", "content": "hi"}]', 8)


def test_model_without_chat_template_asks_for_text_input(tokenizer_info: TokenizerInfo) -> None:
    builder = PromptBuilder(dataclasses.replace(tokenizer_info, chat_template=None))
    with pytest.raises(InvalidInputError, match=r"^messages: this model has no chat template"):
        builder.build("", '[{"role": "user", "content": "hi"}]', 8)
