"""The OpenAI Responses API request (`POST /v1/responses`), validated field by
field like the other OpenAI bodies: text in, text out. What this stack cannot
honour (tools, reasoning, structured output, a stored conversation to continue)
is refused naming the field, never silently ignored. As in schemas.py, each
refusal is the field's type, so the published schema says what is accepted."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .fields import ServedModel, UnitFP32, refused
from .schemas import STREAM_OPTIONS_NOTE, Nothing, Tokens, TokenTimeout, _Strict, only_when_streaming

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
    content: str | list[TextContent]
    id: str | None = None
    status: str | None = None

    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class PlainTextFormat(_Strict):
    type: Literal["text"]


class TextFormat(_Strict):
    format: Annotated[PlainTextFormat | None, refused("only {'type': 'text'} is supported (no structured output)")] = (
        None
    )
    verbosity: str | None = None


class ResponseStreamOptions(_Strict):
    include_obfuscation: bool | None = None


_NO_TOOLS = "not supported by this server (no tools, no extra output fields)"
_NOT_STORED = "not supported by this server (no reasoning models, no stored conversations)"


def _cross_field_rules(model_schema: dict[str, Any]) -> None:
    """The model validator's two rules, said in the schema too."""
    only_when_streaming(model_schema)
    model_schema["allOf"].append(
        {
            "not": {
                "properties": {"background": {"const": True}, "store": {"const": False}},
                "required": ["background", "store"],
            }
        }
    )


class ResponseRequest(_Strict):
    model_config = ConfigDict(json_schema_extra=_cross_field_rules)

    model: ServedModel
    input: str | Annotated[list[InputMessage], Field(min_length=1)]
    instructions: str | None = None
    max_output_tokens: Tokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: UnitFP32 | None = None
    stream: bool | None = False
    stream_options: ResponseStreamOptions | None = Field(default=None, description=STREAM_OPTIONS_NOTE)
    # runs to its end whether or not anyone reads; read or resumed with GET /v1/responses/{id}
    background: bool | None = Field(default=False, description="requires `store` (not false)")
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
    tools: Annotated[Nothing | None, refused(_NO_TOOLS)] = None
    tool_choice: Annotated[Literal["none"] | None, refused("not supported by this server (no tool calling)")] = None
    reasoning: Annotated[None, refused(_NOT_STORED)] = None
    previous_response_id: Annotated[None, refused(_NOT_STORED)] = None
    conversation: Annotated[None, refused(_NOT_STORED)] = None
    include: Annotated[Nothing | None, refused(_NO_TOOLS)] = None
    top_logprobs: int | None = Field(default=None, ge=0, le=0)
    # this stack's extension, as on the other routes
    token_timeout_ms: TokenTimeout | None = None

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
                        raise ValueError(
                            f"[{index}].content[{part_index}]: parts of type '{kind}' are not "
                            f"supported; only {' and '.join(_TEXT_PARTS)}"
                        )
        return value

    @model_validator(mode="after")
    def _background_is_stored(self) -> ResponseRequest:
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
