"""The OpenAI request bodies, validated field by field before anything goes
upstream. Unknown fields are refused (naming them), and so is every known
OpenAI parameter this stack cannot honour: silently ignoring `tools` or
`response_format` would hand the caller an answer of the wrong shape.

Parameters that only describe the caller or hint at caching (`user`,
`metadata`, `store`, `prompt_cache_key`...) are accepted and not acted on.
vLLM's extensions `top_k`, `min_tokens`, `repetition_penalty` and `ignore_eos`
are accepted too: benchmark tools (AIPerf, genai-perf) send them; so is this
stack's `token_timeout_ms` (the engine's per-token timeout, passed through)."""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..upstream import UPSTREAM_TOKEN_TIMEOUT_S

MAX_STOP_SEQUENCES = 16
# the one content part type; image_url, input_audio, file... are refused
_TEXT_PART = "text"


def _unsupported(name: str, hint: str = "") -> str:
    return f"'{name}' is not supported by this server{hint}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StreamOptions(_Strict):
    include_usage: bool | None = None
    # OpenAI pads chunks with random text against side channels; there is nothing to pad here
    include_obfuscation: bool | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[TextPart], None] = None
    name: str | None = None
    # what an SDK echoes back when a previous answer is appended to the conversation
    refusal: str | None = None
    annotations: Any = None
    tool_calls: list[Any] | None = None
    function_call: Any = None
    audio: Any = None
    tool_call_id: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _text_parts_only(cls, value: Any) -> Any:
        # before the union is tried, so the refusal names the part's type rather
        # than listing why the value is neither a string nor a list of parts
        if isinstance(value, list):
            for index, part in enumerate(value):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != _TEXT_PART:
                    raise ValueError(f"content[{index}]: parts of type '{kind}' are not supported; only 'text'")
        return value

    @field_validator("role")
    @classmethod
    def _no_tool_roles(cls, value: str) -> str:
        if value in ("tool", "function"):
            raise ValueError(f"role '{value}' is not supported (this server has no tool calling)")
        return value

    @field_validator("tool_calls")
    @classmethod
    def _no_tool_calls(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError("tool_calls are not supported (this server has no tool calling)")
        return value

    @field_validator("function_call", "audio")
    @classmethod
    def _must_be_empty(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by this server")
        return value

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


class _Sampling(_Strict):
    """What both endpoints share."""
    model: str = Field(min_length=1, max_length=256)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int | None = Field(default=None, ge=1)
    seed: int | None = Field(default=None, ge=0, lt=2 ** 64)
    stop: Union[str, list[str], None] = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None
    user: str | None = Field(default=None, max_length=512)
    # vLLM-compatible extensions
    top_k: int | None = Field(default=None, ge=0)
    min_tokens: int | None = Field(default=None, ge=0)
    repetition_penalty: float | None = Field(default=None, gt=0)
    ignore_eos: bool | None = None
    # this stack's extension: the engine ends the request (finish_reason
    # "timeout", an error event) when no token follows for this long
    token_timeout_ms: int | None = Field(default=None, ge=1, le=int(UPSTREAM_TOKEN_TIMEOUT_S * 1000))

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: StreamOptions | None, info: ValidationInfo) -> StreamOptions | None:
        # as OpenAI answers it: options for a stream that will not happen are a mistake
        if value is not None and not info.data.get("stream"):
            raise ValueError("only allowed when 'stream' is true")
        return value

    @field_validator("stop")
    @classmethod
    def _stop_words(cls, value: str | list[str] | None) -> str | list[str] | None:
        words = [value] if isinstance(value, str) else value or []
        if len(words) > MAX_STOP_SEQUENCES:
            raise ValueError(f"at most {MAX_STOP_SEQUENCES} stop sequences")
        if any(not word for word in words):
            raise ValueError("stop sequences must not be empty")
        return value

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value:
            raise ValueError(_unsupported("logit_bias"))
        return value

    def stop_words(self) -> list[str] | None:
        if self.stop is None:
            return None
        words = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return words or None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    # accepted, not acted on: they describe the caller or hint at storage and caching
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = Field(default=None, max_length=512)
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    parallel_tool_calls: bool | None = None   # meaningless without tools, which are refused
    # refused unless absent or neutral
    tools: list[Any] | None = None
    tool_choice: Any = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    reasoning_effort: Any = None
    verbosity: Any = None
    web_search_options: Any = None
    moderation: Any = None
    prompt_cache_options: Any = None

    @field_validator("top_logprobs")
    @classmethod
    def _no_top_logprobs(cls, value: int | None) -> int | None:
        if value:
            raise ValueError(_unsupported("top_logprobs", " (only the chosen tokens' log-probs: "
                                                          "send logprobs=true and top_logprobs 0 or nothing)"))
        return value

    @field_validator("tools", "functions")
    @classmethod
    def _no_tools(cls, value: list[Any] | None) -> list[Any] | None:
        if value:
            raise ValueError(_unsupported("tools", " (no tool calling)"))
        return value

    @field_validator("tool_choice", "function_call")
    @classmethod
    def _no_tool_choice(cls, value: Any) -> Any:
        if value not in (None, "none"):
            raise ValueError(_unsupported("tool choice", " (no tool calling; only 'none')"))
        return value

    @field_validator("response_format")
    @classmethod
    def _text_format(cls, value: Any) -> Any:
        if value is not None and not (isinstance(value, dict) and value == {"type": "text"}):
            raise ValueError(_unsupported("response_format", " (only {'type': 'text'})"))
        return value

    @field_validator("modalities")
    @classmethod
    def _text_modality(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and value != ["text"]:
            raise ValueError(_unsupported("modalities", " (only ['text'])"))
        return value

    @field_validator("audio", "prediction", "reasoning_effort", "verbosity", "web_search_options", "moderation")
    @classmethod
    def _absent(cls, value: Any) -> Any:
        if value is not None:
            raise ValueError("not supported by this server")
        return value

    def output_limit(self) -> int | None:
        # max_completion_tokens is the current name; max_tokens the deprecated one
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    # token-id prompts are refused: the public models take text
    prompt: Union[str, list[str]]
    logprobs: int | None = Field(default=None, ge=0, le=5)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = Field(default=None, ge=1)

    @field_validator("prompt")
    @classmethod
    def _one_text_prompt(cls, value: str | list[str]) -> str | list[str]:
        prompts = [value] if isinstance(value, str) else value
        if not prompts:
            raise ValueError("must not be empty")
        if any(not p for p in prompts):
            raise ValueError("prompts must not be empty strings")
        return value

    @field_validator("logprobs")
    @classmethod
    def _chosen_only(cls, value: int | None) -> int | None:
        if value:
            raise ValueError(_unsupported("logprobs > 0", " (only the chosen tokens' log-probs: logprobs=0)"))
        return value

    @field_validator("echo")
    @classmethod
    def _no_echo(cls, value: bool | None) -> bool | None:
        if value:
            raise ValueError(_unsupported("echo"))
        return value

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, value: str | None) -> str | None:
        if value:
            raise ValueError(_unsupported("suffix"))
        return value

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None
