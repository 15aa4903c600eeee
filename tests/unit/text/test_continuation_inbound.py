"""`continuation_ids` in preprocessing (and llm_bls, through the same
builder): appended after the rendered prompt, counted as output against
`max_tokens`, announced to the LLM step as `continuation_length`, and handed
to postprocessing in the request context."""

from __future__ import annotations

import json

import numpy as np
import pytest

from contract.errors import InvalidInputError
from ensemble.inbound.llm_request import EngineMaxTokens, LLMRequestBuilder, llm_inputs, scalar
from ensemble.inbound.prompt import PromptBuilder
from ensemble.request_context import RequestContext
from ensemble.tokenizer_info import TokenizerInfo

Arrays = dict[str, np.ndarray]


def _builder(info: TokenizerInfo, max_context: int | None = None) -> LLMRequestBuilder:
    return LLMRequestBuilder(
        info,
        PromptBuilder(info, max_context=max_context),
        EngineMaxTokens(default_max_tokens=16, max_tokens_limit=4096),
    )


def _inputs(continuation: list[int] | None = None, **values: object) -> Arrays:
    """Public request tensors as Triton hands them over: [1, n]; INT32 ids."""
    arrays: Arrays = {}
    for name, value in values.items():
        arrays[name] = (
            np.asarray([[value.encode()]], dtype=np.object_) if isinstance(value, str) else np.asarray([[value]])
        )
    if continuation is not None:
        arrays["continuation_ids"] = np.asarray([continuation], dtype=np.int32)
    return arrays


def _context(built: Arrays) -> RequestContext:
    return RequestContext.from_json(scalar(built.get, "request_context"))


def test_the_ids_follow_the_rendered_prompt_and_their_count_reaches_the_llm_step(tokenizer_info: TokenizerInfo) -> None:
    builder = _builder(tokenizer_info)
    plain = builder.build(_inputs(text_input="The capital of France is", max_tokens=10).get)
    built = builder.build(_inputs([11, 22, 33], text_input="The capital of France is", max_tokens=10).get)
    prompt = plain["input_ids"][0].tolist()
    assert built["input_ids"].tolist() == [prompt + [11, 22, 33]]
    assert built["input_lengths"].tolist() == [[len(prompt) + 3]]
    assert built["continuation_length"].tolist() == [[3]] and plain["continuation_length"].tolist() == [[0]]
    assert built["request_output_len"].tolist() == [[10]]  # the continuation counts inside it
    context = _context(built)
    assert context.continuation_ids == [11, 22, 33] and context.primed_ids == [11, 22, 33]
    assert _context(plain).continuation_ids == []


def test_a_chat_is_rendered_with_its_generation_prompt_before_the_ids(tokenizer_info: TokenizerInfo) -> None:
    builder = _builder(tokenizer_info)
    messages = json.dumps([{"role": "user", "content": "Hi"}])
    plain = builder.build(_inputs(text_input="", messages=messages).get)["input_ids"][0].tolist()
    built = builder.build(_inputs([7, 8], text_input="", messages=messages).get)["input_ids"][0].tolist()
    assert built == plain + [7, 8]


def test_an_empty_list_is_no_continuation(tokenizer_info: TokenizerInfo) -> None:
    built = _builder(tokenizer_info).build(_inputs([], text_input="Hi").get)
    assert built["continuation_length"].tolist() == [[0]] and _context(built).continuation_ids == []


def test_with_the_input_echoed_nothing_is_primed(tokenizer_info: TokenizerInfo) -> None:
    # exclude_input_in_output false: the LLM step's first response repeats the
    # ids as sent, continuation included, so the text stages decode it there
    built = _builder(tokenizer_info).build(_inputs([5, 6], text_input="Hi", exclude_input_in_output=False).get)
    context = _context(built)
    assert context.continuation_ids == [5, 6] and context.echo_input and context.primed_ids == []


@pytest.mark.parametrize(
    ("continuation", "max_tokens", "message"),
    [
        ([1, -2, 3], 10, r"^continuation_ids: token ids must be >= 0, got -2$"),
        (list(range(10)), 10, r"^continuation_ids: 10 ids leave nothing to generate within max_tokens 10 "),
        (list(range(20)), 10, r"^continuation_ids: 20 ids leave nothing to generate within max_tokens 10 "),
        ([1] * 16, None, r"^continuation_ids: 16 ids leave nothing to generate within max_tokens 16 "),  # the default
    ],
)
def test_bad_continuations_are_refused_naming_the_field(
    tokenizer_info: TokenizerInfo, continuation: list[int], max_tokens: int | None, message: str
) -> None:
    values: dict[str, object] = {"text_input": "Hi"}
    if max_tokens is not None:
        values["max_tokens"] = max_tokens
    with pytest.raises(InvalidInputError, match=message):
        _builder(tokenizer_info).build(_inputs(continuation, **values).get)


def test_non_integer_ids_are_refused(tokenizer_info: TokenizerInfo) -> None:
    inputs = {**_inputs(text_input="Hi"), "continuation_ids": np.asarray([[1.5]], dtype=np.float32)}
    with pytest.raises(InvalidInputError, match=r"^continuation_ids: must be integer token ids, got float32$"):
        _builder(tokenizer_info).build(inputs.get)


def test_one_id_fewer_than_max_tokens_is_allowed(tokenizer_info: TokenizerInfo) -> None:
    built = _builder(tokenizer_info).build(_inputs(list(range(9)), text_input="Hi", max_tokens=10).get)
    assert built["continuation_length"].tolist() == [[9]]


def test_prompt_and_max_tokens_must_still_fit_the_context(tokenizer_info: TokenizerInfo) -> None:
    builder = _builder(tokenizer_info, max_context=32)
    prompt = len(builder.build(_inputs(text_input="one two three four", max_tokens=4).get)["input_ids"][0])
    fits = 32 - prompt
    # the continuation lies inside max_tokens: it takes no room of its own
    built = builder.build(_inputs([9] * (fits - 1), text_input="one two three four", max_tokens=fits).get)
    assert built["input_lengths"].tolist() == [[prompt + fits - 1]]
    with pytest.raises(InvalidInputError, match=r"^text_input: prompt of \d+ tokens \+ max_tokens"):
        builder.build(_inputs([9], text_input="one two three four", max_tokens=fits + 1).get)


def test_llm_bls_passes_the_count_to_the_llm_step(tokenizer_info: TokenizerInfo) -> None:
    inputs = _inputs([4, 5], text_input="Hi", max_tokens=8)
    built = _builder(tokenizer_info).build(inputs.get)
    step = llm_inputs(built, inputs.get)
    assert step["continuation_length"].tolist() == [[2]]
    assert step["input_ids"][0, -2:].tolist() == [4, 5]
    assert "continuation_ids" not in step  # the LLM step gets them inside input_ids
