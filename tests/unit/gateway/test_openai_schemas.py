"""Request validation (400 naming the parameter, in OpenAI's shape) and the
translation of accepted requests to the public tensors."""

from __future__ import annotations

import asyncio

import pytest

from gateway.config import TierConfig
from gateway.core.engine_request import capped_max_tokens
from gateway.openai.schemas import ChatCompletionRequest, CompletionRequest
from gateway.openai.translate import chat_upstream, completion_upstream, finish_reason
from tests.unit.gateway.openai_fakes import AUTH, harness, simple_script

CHAT = {"model": "ensemble", "messages": [{"role": "user", "content": "Hi"}]}


def post(body: dict, path: str = "/v1/chat/completions"):
    h = harness(simple_script("x"))

    async def go():
        async with h.client() as client:
            return await client.post(path, json=body, headers=AUTH)

    response = asyncio.run(go())
    return h, response


@pytest.mark.parametrize(
    "extra,param,words",
    [
        ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools", "not supported"),
        ({"tool_choice": "auto"}, "tool_choice", "not supported"),
        ({"functions": [{"name": "f"}]}, "functions", "not supported"),
        ({"response_format": {"type": "json_object"}}, "response_format", "only {'type': 'text'}"),
        ({"logit_bias": {"50256": -100}}, "logit_bias", "not supported"),
        ({"top_logprobs": 2, "logprobs": True}, "top_logprobs", "chosen tokens"),
        ({"audio": {"voice": "alloy"}}, "audio", "not supported"),
        ({"modalities": ["text", "audio"]}, "modalities", "only ['text']"),
        ({"reasoning_effort": "high"}, "reasoning_effort", "not supported"),
        ({"frobnicate": 1}, "frobnicate", "Unrecognized request argument supplied: frobnicate"),
        ({"": 1}, "", 'Unrecognized request argument supplied: "" (an empty name)'),
        ({"temperature": 3}, "temperature", "less than or equal to 2"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"seed": -1}, "seed", "greater than or equal to 0"),
        ({"max_tokens": 0}, "max_tokens", "greater than or equal to 1"),
        ({"stop": ["a", ""]}, "stop", "must not be empty"),
        ({"stop": [str(i) for i in range(17)]}, "stop", "at most 16"),
        ({"messages": []}, "messages", "at least 1"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when 'stream' is true"),
        ({"messages": [{"role": "tool", "content": "x", "tool_call_id": "1"}]}, "messages[0].role", "role 'tool'"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}]},
            "messages[0].content",
            "only 'text'",
        ),
        ({"messages": [{"role": "user", "content": "x", "extra": 1}]}, "messages[0].extra", "Unrecognized"),
    ],
)
def test_unsupported_or_invalid_chat_params_are_400_naming_them(extra, param, words):
    h, response = post({**CHAT, **extra})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] is not None and error["param"].startswith(param), error
    assert words in error["message"], error["message"]
    assert h.transport.opened == [] and h.policy.admissions == []


@pytest.mark.parametrize(
    "extra,param",
    [
        ({"logprobs": 2}, "logprobs"),
        ({"echo": True}, "echo"),
        ({"suffix": "x"}, "suffix"),
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ""}, "prompt"),
        ({"best_of": 3}, "best_of"),
    ],
)
def test_unsupported_completion_params_are_400(extra, param):
    h, response = post({"model": "ensemble", "prompt": "x", **extra}, "/v1/completions")
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"].startswith(param)
    assert h.transport.opened == []


def test_invalid_json_is_400_in_openai_shape():
    h = harness(simple_script("x"))

    async def go():
        async with h.client() as client:
            return await client.post(
                "/v1/chat/completions", content=b"{not json", headers={**AUTH, "content-type": "application/json"}
            )

    response = asyncio.run(go())
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid_json"


def test_what_sdks_send_by_default_or_echo_back_is_accepted():
    # a previous answer appended as the SDK serializes it, neutral tool settings, caching hints
    body = {
        **CHAT,
        "messages": [
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {
                "role": "assistant",
                "content": "Hello",
                "refusal": None,
                "tool_calls": None,
                "function_call": None,
                "audio": None,
                "annotations": [],
            },
            {"role": "user", "content": "Again", "name": "bob"},
        ],
        "tool_choice": "none",
        "response_format": {"type": "text"},
        "store": False,
        "metadata": {"a": "b"},
        "user": "u1",
        "service_tier": "auto",
        "parallel_tool_calls": True,
        "n": 1,
        "stream_options": None,
        "modalities": ["text"],
        "prompt_cache_key": "k",
    }
    request = ChatCompletionRequest.model_validate(body)
    (upstream,) = chat_upstream(request, TierConfig(), 4, "rid")
    assert upstream.options.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello"},
        {"role": "user", "content": "Again"},
    ]
    h, response = post(body)
    assert response.status_code == 200, response.text


def test_translation_of_sampling_parameters():
    request = ChatCompletionRequest.model_validate(
        {
            **CHAT,
            "max_tokens": 9,
            "max_completion_tokens": 20,
            "temperature": 0.5,
            "top_p": 0.9,
            "seed": 3,
            "stop": "END",
            "presence_penalty": 0.1,
            "frequency_penalty": -0.2,
            "top_k": 4,
            "min_tokens": 2,
            "repetition_penalty": 1.1,
            "ignore_eos": True,
            "n": 2,
        }
    )
    first, second = chat_upstream(request, TierConfig(priority=5), 4, "abc")
    options = first.options
    assert (options.max_tokens, options.temperature, options.top_p, options.seed) == (20, 0.5, 0.9, 3)
    assert options.stop_words == ["END"] and options.top_k == 4 and options.min_tokens == 2
    assert (options.presence_penalty, options.frequency_penalty, options.repetition_penalty) == (0.1, -0.2, 1.1)
    assert options.ignore_eos is True and options.priority == 5 and options.return_output_ids is True
    assert options.return_log_probs is None and (first.index, second.index) == (0, 1)
    assert (options.request_id, second.options.request_id) == ("abc-0", "abc-1")
    assert second.options.seed == 4  # seed + choice: n seeded choices are not n copies
    completion = CompletionRequest.model_validate({"model": "llm_bls", "prompt": ["a", "b"], "stop": ["x", "y"]})
    items = completion_upstream(completion, TierConfig(), 4, "r")
    assert [(i.index, i.text_input, i.prompt_index) for i in items] == [(0, "a", 0), (1, "b", 1)]
    assert items[0].options.stop_words == ["x", "y"] and items[0].options.messages is None
    assert [i.options.seed for i in items] == [None, None]
    seeded = completion_upstream(
        CompletionRequest.model_validate({"model": "llm_bls", "prompt": ["a", "b"], "n": 2, "seed": 2**64 - 1}),
        TierConfig(),
        4,
        "r",
    )
    assert [i.options.seed for i in seeded] == [2**64 - 1, 0, 2**64 - 1, 0]


def test_max_tokens_cap_and_finish_reasons():
    assert capped_max_tokens(None, TierConfig()) is None
    assert capped_max_tokens(50, TierConfig()) == 50
    assert capped_max_tokens(None, TierConfig(max_tokens_cap=16)) == 16
    assert capped_max_tokens(50, TierConfig(max_tokens_cap=16)) == 16
    assert capped_max_tokens(8, TierConfig(max_tokens_cap=16)) == 8
    assert [finish_reason(r) for r in ("stop", "length", "content_filter", "cancelled", "timeout", "error")] == [
        "stop",
        "length",
        "content_filter",
        None,
        None,
        None,
    ]
