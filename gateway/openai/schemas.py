"""The OpenAI request bodies, validated field by field before anything goes
upstream. Unknown fields are refused (naming them), and so is every known
OpenAI parameter this stack cannot honour: silently ignoring `tools` or
`response_format` would hand the caller an answer of the wrong shape.

Parameters that only describe the caller or hint at caching (`user`,
`metadata`, `store`, `prompt_cache_key`...) are accepted and not acted on.
vLLM's extensions `top_k`, `min_tokens`, `repetition_penalty` and `ignore_eos`
are accepted too: benchmark tools (AIPerf, genai-perf) send them; so is this
stack's `token_timeout_ms` (the engine's per-token timeout, passed through).

The published OpenAPI schema is generated from these models: a refusal is the
field's type (gateway/openai/fields.py), not a check beside it, so the schema
says what is accepted. Only the rules that relate two fields stay validators,
and each is said in the schema too (`allOf` on the model, `cross_field`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from ..core.upstream import UPSTREAM_TOKEN_TIMEOUT_S
from .fields import INT32_MAX, FalseOnly, PositiveFP32, ServedModel, UnitFP32, refused, unsupported

MAX_STOP_SEQUENCES = 16
# the one content part type; image_url, input_audio, file... are refused
_TEXT_PART = "text"
_NO_TOOLS = "not supported by this server"

NonEmpty = Annotated[str, Field(min_length=1)]
Tokens = Annotated[int, Field(ge=1, le=INT32_MAX)]  # an INT32 tensor upstream
Nothing = Annotated[list[Any], Field(max_length=0)]  # an empty list: the neutral value
# a per-token deadline under a second is shorter than a prefill on this stack's
# CPU engine: every request would end in a timeout (504), whatever it asked
MIN_TOKEN_TIMEOUT_MS = 1000
TokenTimeout = Annotated[
    int,
    Field(
        ge=MIN_TOKEN_TIMEOUT_MS,
        le=int(UPSTREAM_TOKEN_TIMEOUT_S * 1000),
        description="this stack's extension: the engine ends the request (an error, "
        "504 `upstream_timeout`) when no token follows for this long",
    ),
]
SEED_MAX = 2**64 - 1  # a UINT64 tensor upstream
STREAM_OPTIONS_NOTE = "only with `stream: true` (else 400)"


def only_when_streaming(model_schema: dict[str, Any]) -> None:
    """`stream_options` only with `stream: true`, said in the schema too."""
    model_schema.setdefault("allOf", []).append(
        {
            "anyOf": [
                {"properties": {"stream_options": {"type": "null"}}},
                {"properties": {"stream": {"const": True}}, "required": ["stream"]},
            ]
        }
    )


class _Strict(BaseModel):
    # strict: no "5" for 5 or 1 for true, as the schema's types say; no NaN or
    # Infinity, which JSON has no literal for
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ChatStreamOptions(_Strict):
    include_usage: bool | None = None
    # OpenAI pads chunks with random text against side channels; there is nothing to pad here
    include_obfuscation: bool | None = None


class TextPart(_Strict):
    type: Literal["text"]
    text: str


def _role_refusal(value: Any) -> str | None:
    if value in ("tool", "function"):
        return f"role '{value}' is not supported (this server has no tool calling)"
    return None


class ChatMessage(_Strict):
    role: Annotated[Literal["system", "developer", "user", "assistant"], refused(_role_refusal)]
    content: str | list[TextPart] | None = None
    name: str | None = None
    # what an SDK echoes back when a previous answer is appended to the conversation
    refusal: str | None = None
    annotations: Any = None
    tool_calls: Annotated[Nothing | None, refused("tool_calls are not supported (this server has no tool calling)")] = (
        None
    )
    function_call: Annotated[None, refused(_NO_TOOLS)] = None
    audio: Annotated[None, refused(_NO_TOOLS)] = None
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

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)


def _stop_refusal(value: Any) -> str | None:
    words = [value] if isinstance(value, str) else value if isinstance(value, list) else []
    if len(words) > MAX_STOP_SEQUENCES:
        return f"at most {MAX_STOP_SEQUENCES} stop sequences"
    if any(word == "" for word in words):
        return "stop sequences must not be empty"
    return None


class _Sampling(_Strict):
    """What both endpoints share."""

    model_config = ConfigDict(json_schema_extra=only_when_streaming)

    model: ServedModel
    stream: bool | None = False
    stream_options: ChatStreamOptions | None = Field(default=None, description=STREAM_OPTIONS_NOTE)
    max_tokens: Tokens | None = None
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: UnitFP32 | None = None
    # the deployment's bound (gateway.limits.max_n) is added to the published schema
    # by gateway/openai/openapi.py and checked by translate.check_n
    n: int | None = Field(
        default=None,
        ge=1,
        le=INT32_MAX,
        description="at most `gateway.limits.max_n`; on completions n × number of prompts too",
    )
    seed: int | None = Field(default=None, ge=0, le=SEED_MAX)
    stop: Annotated[
        NonEmpty | Annotated[list[NonEmpty], Field(max_length=MAX_STOP_SEQUENCES)] | None, refused(_stop_refusal)
    ] = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    logit_bias: Annotated[
        Annotated[dict[str, float], Field(max_length=0)] | None, refused(unsupported("logit_bias"))
    ] = None
    user: str | None = Field(default=None, max_length=512)
    # vLLM-compatible extensions
    top_k: int | None = Field(default=None, ge=0, le=INT32_MAX)
    min_tokens: int | None = Field(default=None, ge=0, le=INT32_MAX)
    repetition_penalty: PositiveFP32 | None = None
    ignore_eos: bool | None = None
    token_timeout_ms: TokenTimeout | None = None

    @field_validator("stream_options")
    @classmethod
    def _only_when_streaming(cls, value: ChatStreamOptions | None, info: ValidationInfo) -> ChatStreamOptions | None:
        # as OpenAI answers it: options for a stream that will not happen are a mistake
        if value is not None and not info.data.get("stream"):
            raise ValueError("only allowed when 'stream' is true")
        return value

    def stop_words(self) -> list[str] | None:
        if self.stop is None:
            return None
        words = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return words or None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class TextResponseFormat(_Strict):
    type: Literal["text"]


def _top_logprobs_refusal(value: Any) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return unsupported(
            "top_logprobs", " (only the chosen tokens' log-probs: send logprobs=true and top_logprobs 0 or nothing)"
        )
    return None


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Tokens | None = None
    logprobs: bool | None = None
    top_logprobs: Annotated[Annotated[int, Field(ge=0, le=0)] | None, refused(_top_logprobs_refusal)] = None
    # accepted, not acted on: they describe the caller or hint at storage and caching
    metadata: dict[str, str] | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = Field(default=None, max_length=512)
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    parallel_tool_calls: bool | None = None  # meaningless without tools, which are refused
    prompt_cache_options: Any = None
    # refused unless absent or neutral: the type is the neutral value
    tools: Annotated[Nothing | None, refused(unsupported("tools", " (no tool calling)"))] = None
    tool_choice: Annotated[
        Literal["none"] | None, refused(unsupported("tool choice", " (no tool calling; only 'none')"))
    ] = None
    functions: Annotated[Nothing | None, refused(unsupported("tools", " (no tool calling)"))] = None
    function_call: Annotated[
        Literal["none"] | None, refused(unsupported("tool choice", " (no tool calling; only 'none')"))
    ] = None
    response_format: Annotated[
        TextResponseFormat | None, refused(unsupported("response_format", " (only {'type': 'text'})"))
    ] = None
    modalities: Annotated[
        Annotated[list[Literal["text"]], Field(min_length=1, max_length=1)] | None,
        refused(unsupported("modalities", " (only ['text'])")),
    ] = None
    audio: Annotated[None, refused(_NO_TOOLS)] = None
    prediction: Annotated[None, refused(_NO_TOOLS)] = None
    reasoning_effort: Annotated[None, refused(_NO_TOOLS)] = None
    verbosity: Annotated[None, refused(_NO_TOOLS)] = None
    web_search_options: Annotated[None, refused(_NO_TOOLS)] = None
    moderation: Annotated[None, refused(_NO_TOOLS)] = None

    def output_limit(self) -> int | None:
        # max_completion_tokens is the current name; max_tokens the deprecated one
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def _prompt_refusal(value: Any) -> str | None:
    if value == []:
        return "must not be empty"
    prompts = value if isinstance(value, list) else [value]
    if any(p == "" for p in prompts):
        return "prompts must not be empty strings"
    if any(isinstance(p, (int, list)) and not isinstance(p, bool) for p in prompts):
        return "token-id prompts are not supported; send text"
    return None


class CompletionRequest(_Sampling):
    # token-id prompts are refused: the public models take text
    prompt: Annotated[NonEmpty | Annotated[list[NonEmpty], Field(min_length=1)], refused(_prompt_refusal)] = Field(
        description="at most `gateway.limits.max_n` prompts, n × prompts too"
    )
    logprobs: Annotated[
        Annotated[int, Field(ge=0, le=0)] | None,
        refused(
            lambda v: (
                unsupported("logprobs > 0", " (only the chosen tokens' log-probs: logprobs=0)")
                if isinstance(v, int) and not isinstance(v, bool) and v > 0
                else None
            )
        ),
    ] = None
    echo: Annotated[FalseOnly, refused(unsupported("echo"))] = None
    suffix: Annotated[Annotated[str, Field(max_length=0)] | None, refused(unsupported("suffix"))] = None
    best_of: int | None = Field(
        default=None, ge=1, le=INT32_MAX, description="only equal to `n`: this server does not rank candidates"
    )

    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def output_limit(self) -> int | None:
        return self.max_tokens

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs is not None
