"""OpenAI's response objects, as plain dicts: whole answers and SSE chunks for
`chat.completion` and `text_completion`.

Log-probs are the chosen tokens' only. The gateway holds no tokenizer, so a
token is named by its id in vLLM's `token_id:<id>` form
(`return_tokens_as_token_ids`), which tools already parse."""

from __future__ import annotations

import json
from typing import Any

from ..core.generation import ChoiceState
from .translate import finish_reason


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def _final_reason(choice: ChoiceState) -> str:
    # an engine request that ended with no reason at all ended normally
    return finish_reason(choice.engine_finish) or "stop"


def chat_logprobs(token_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {
        "content": [
            {"token": f"token_id:{t}", "logprob": lp, "bytes": None, "top_logprobs": []}
            for t, lp in zip(token_ids, logprobs)
        ],
        "refusal": None,
    }


def completion_logprobs(token_ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    return {
        "tokens": [f"token_id:{t}" for t in token_ids],
        "token_logprobs": list(logprobs[: len(token_ids)]),
        "top_logprobs": None,
        "text_offset": None,
    }


class ChatFormat:
    object = "chat.completion"
    chunk_object = "chat.completion.chunk"

    @staticmethod
    def choice(choice: ChoiceState, with_logprobs: bool) -> dict[str, Any]:
        return {
            "index": choice.index,
            "message": {"role": "assistant", "content": "".join(choice.text), "refusal": None},
            "logprobs": chat_logprobs(choice.token_ids, choice.logprobs) if with_logprobs else None,
            "finish_reason": _final_reason(choice),
        }

    @staticmethod
    def delta(
        choice: ChoiceState, text: str, first: bool, reason: str | None, logprobs: tuple[list[int], list[float]] | None
    ) -> dict[str, Any]:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        if reason is not None and not text and not first:
            delta = {}
        return {
            "index": choice.index,
            "delta": delta,
            "logprobs": chat_logprobs(*logprobs) if logprobs is not None else None,
            "finish_reason": reason,
        }


class CompletionFormat:
    object = "text_completion"
    chunk_object = "text_completion"

    @staticmethod
    def choice(choice: ChoiceState, with_logprobs: bool) -> dict[str, Any]:
        return {
            "index": choice.index,
            "text": "".join(choice.text),
            "logprobs": completion_logprobs(choice.token_ids, choice.logprobs) if with_logprobs else None,
            "finish_reason": _final_reason(choice),
        }

    @staticmethod
    def delta(
        choice: ChoiceState, text: str, first: bool, reason: str | None, logprobs: tuple[list[int], list[float]] | None
    ) -> dict[str, Any]:
        return {
            "index": choice.index,
            "text": text,
            "logprobs": completion_logprobs(*logprobs) if logprobs is not None else None,
            "finish_reason": reason,
        }


Format = type[ChatFormat] | type[CompletionFormat]


def whole(
    fmt: Format,
    response_id: str,
    created: int,
    model: str,
    choices: list[ChoiceState],
    prompt_tokens: int,
    with_logprobs: bool,
) -> dict[str, Any]:
    completion = sum(c.completion_tokens for c in choices)
    return {
        "id": response_id,
        "object": fmt.object,
        "created": created,
        "model": model,
        "choices": [fmt.choice(c, with_logprobs) for c in sorted(choices, key=lambda c: c.index)],
        "usage": usage(prompt_tokens, completion),
    }


def chunk(
    fmt: Format, response_id: str, created: int, model: str, choices: list[dict[str, Any]], include_usage: bool
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": response_id,
        "object": fmt.chunk_object,
        "created": created,
        "model": model,
        "choices": choices,
    }
    if include_usage:
        body["usage"] = None  # OpenAI: null on every chunk but the last when usage is asked for
    return body


def usage_chunk(
    fmt: Format, response_id: str, created: int, model: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": response_id,
        "object": fmt.chunk_object,
        "created": created,
        "model": model,
        "choices": [],
        "usage": usage(prompt_tokens, completion_tokens),
    }
