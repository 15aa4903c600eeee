"""`continuation_ids` against the real tritonserver: a greedy answer cut after
10 tokens and continued from those ids (as the gateway does when a stream's
replica dies) is the uninterrupted answer, text and ids alike."""

from __future__ import annotations

import asyncio

import pytest

from client import AsyncLLMClient, ClientConfig, GenerationResult, RequestError

pytestmark = pytest.mark.e2e
POEM = [{"role": "user", "content": "Write a short poem about the sea."}]
TOTAL, CUT = 24, 10


@pytest.mark.parametrize(
    ("model", "transport", "streaming"),
    [("ensemble", "grpc", True), ("llm_bls", "sse", True), ("ensemble", "sse", False)],
)
def test_a_continued_answer_equals_the_uninterrupted_one(
    triton_server, model: str, transport: str, streaming: bool
) -> None:
    url = triton_server.http_url if transport == "sse" else triton_server.grpc_url
    # ignore_eos: the answer really runs to TOTAL tokens, past the cut
    greedy = dict(messages=POEM, temperature=0.0, ignore_eos=True, return_output_ids=True)

    async def answers() -> tuple[GenerationResult, GenerationResult, GenerationResult]:
        async with AsyncLLMClient(ClientConfig(url=url, transport=transport, model=model)) as client:
            whole = await client.generate(max_tokens=TOTAL, **greedy)
            head = await client.generate(max_tokens=CUT, **greedy)
            rest = await client.stream(
                max_tokens=TOTAL, continuation_ids=head.output_ids, streaming=streaming, **greedy
            ).collect()
            return whole, head, rest

    whole, head, rest = asyncio.run(answers())
    print(f"\n[{model}/{transport}] {head.text!r} + {rest.text!r}")
    assert len(whole.output_ids) == TOTAL and head.output_ids == whole.output_ids[:CUT]
    assert head.output_ids + rest.output_ids == whole.output_ids
    assert head.text + rest.text == whole.text
    assert rest.num_output_tokens == TOTAL - CUT and rest.finish_reason == "length"
    assert rest.num_input_tokens == whole.num_input_tokens == head.num_input_tokens


def test_with_the_input_echoed_the_continuation_follows_the_prompt(triton_server) -> None:
    """exclude_input_in_output false: the ids as sent (prompt, continuation)
    lead the answer, and its text decodes them in place, nothing replayed."""
    greedy = dict(temperature=0.0, ignore_eos=True, return_output_ids=True)

    async def answers() -> tuple[GenerationResult, GenerationResult]:
        async with AsyncLLMClient(ClientConfig(url=triton_server.http_url, model="ensemble")) as client:
            whole = await client.generate("The sea is", max_tokens=CUT + 2, **greedy)
            echoed = await client.stream(
                "The sea is",
                max_tokens=CUT + 2,
                continuation_ids=whole.output_ids[:CUT],
                exclude_input_in_output=False,
                streaming=False,
                **greedy,
            ).collect()
            return whole, echoed

    whole, echoed = asyncio.run(answers())
    assert echoed.output_ids[-(CUT + 2) :] == whole.output_ids
    assert echoed.text.startswith("The sea is") and echoed.text.endswith(whole.text)


@pytest.mark.parametrize("model", ["ensemble", "llm_bls"])
def test_a_continuation_that_leaves_nothing_to_generate_is_refused(triton_server, model: str) -> None:
    async def refused() -> None:
        async with AsyncLLMClient(ClientConfig(url=triton_server.http_url, model=model)) as client:
            await client.generate("Hi", max_tokens=3, continuation_ids=[11, 12, 13])

    with pytest.raises(RequestError, match="continuation_ids: 3 ids leave nothing to generate within max_tokens 3"):
        asyncio.run(refused())
