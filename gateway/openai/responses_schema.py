"""The OpenAI Responses API request (`POST /v1/responses`), validated field by
field like the other OpenAI bodies: text in, text out. What this stack cannot
honour (tools, reasoning, structured output, a stored conversation to continue)
is refused naming the field, never silently ignored."""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import Field, field_validator, model_validator

from ..upstream import UPSTREAM_TOKEN_TIMEOUT_S
from .schemas import _Strict

_TEXT_PARTS = ("input_text", "output_text")


class TextContent(_Strict):
    type: Literal["input_text", "output_text"]
    text: str
    # what an SDK echoes back when a previous answer is appended to the input
    annotations: Any = None
    logprobs: Any = None


class InputMessage(_Strict):
    type: Literal["message"] | None = None
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[TextContent]]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class TextFormat(_Strict):
    format: dict[str, Any] | None = None
    verbosity: str | None = None

    @field_validator("format")
    @classmethod
    def _plain_text(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if value is not None and value.get("type") != "text":
            raise ValueError("only {'type': 'text'} is supported (no structured output)")
        return value


class StreamOptions(_Strict):
    include_obfuscation: bool | None = None


class ResponseRequest(_Strict):
    model: str = Field(min_length=1, max_length=256)
    input: Union[str, list[InputMessage]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # runs to its end whether or not anyone reads; read or resumed with GET /v1/responses/{id}
    background: bool | None = False
    store: bool | None = True
    # accepted and not acted on: they describe the caller or hint at caching
    user: str | None = Field(default=None, max_length=512)
    safety_identifier: str | None = Field(default=None, max_length=512)
    metadata: dict[str, str] | None = None
    prompt_cache_key: str | None = None
    service_tier: str | None = None
    parallel_tool_calls: bool | None = None
    truncation: Literal["disabled"] | None = None
    text: TextFormat | None = None
    # refused unless empty: this server has no tools, reasoning or stored conversations
    tools: list[Any] | None = None
    tool_choice: Any = None
    reasoning: Any = None
    previous_response_id: str | None = None
    conversation: Any = None
    include: list[str] | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    # this stack's extension, as on the other routes
    token_timeout_ms: int | None = Field(default=None, ge=1, le=int(UPSTREAM_TOKEN_TIMEOUT_S * 1000))

    @field_validator("input", mode="before")
    @classmethod
    def _some_text_input(cls, value: Any) -> Any:
        # before the union is tried, so that a refusal names the item and part
        # instead of explaining why the list is not a string
        if isinstance(value, list):
            if not value:
                raise ValueError("must not be empty")
            for index, item in enumerate(value):
                content = item.get("content") if isinstance(item, dict) else None
                for part_index, part in enumerate(content if isinstance(content, list) else []):
                    kind = part.get("type") if isinstance(part, dict) else None
                    if kind not in _TEXT_PARTS:
                        raise ValueError(f"[{index}].content[{part_index}]: parts of type '{kind}' are not "
                                         f"supported; only {' and '.join(_TEXT_PARTS)}")
        return value

    @field_validator("tools", "include")
    @classmethod
    def _empty(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("not supported by this server (no tools, no extra output fields)")
        return value

    @field_validator("tool_choice")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none"):
            raise ValueError("not supported by this server (no tool calling)")
        return value

    @field_validator("reasoning", "conversation", "previous_response_id")
    @classmethod
    def _absent(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by this server (no reasoning models, no stored conversations)")
        return value

    @model_validator(mode="after")
    def _background_is_stored(self) -> "ResponseRequest":
        if self.background and self.store is False:
            raise ValueError("background: requires store (a background response is kept to be read later)")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed when 'stream' is true")
        return self

    def messages(self) -> list[dict[str, str]]:
        """The conversation as the chat template takes it (`developer` is `system`)."""
        turns = [{"role": "system", "content": self.instructions}] if self.instructions else []
        if isinstance(self.input, str):
            return turns + [{"role": "user", "content": self.input}]
        roles = {"developer": "system"}
        return turns + [{"role": roles.get(m.role, m.role), "content": m.text()} for m in self.input]
