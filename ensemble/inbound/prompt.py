"""Request text → prompt token ids: plain ``text_input`` or OpenAI-style
``messages`` through the model's chat template, fitted to the context window.

Context policy for chats: when prompt + ``max_tokens`` do not fit, whole turns
(a user message and the replies after it) are dropped oldest first; system
messages and everything from the last user message on are always kept. Plain
text is never cut: silently losing the start of a prompt is worse than a 400.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from contract.errors import InvalidInputError

from ..tokenizer_info import TokenizerInfo
from .chat_template import ChatTemplate

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class PromptConfig:
    # Added as the first message when a conversation brings no system message;
    # empty leaves that to the chat template (many add their own).
    default_system_prompt: str = ""
    max_messages: int = 1024  # messages in one conversation; more are refused (invalid input)
    # [ {"role", "content"} ] is 2 deep; the margin leaves room for content parts
    max_messages_depth: int = 8
    # Byte bounds checked before any parsing or tokenizing (a megabyte takes
    # seconds to tokenize). 0 derives them from the context: BYTES_PER_TOKEN
    # bytes per context token for `text_input` (plain text is never cut), and
    # MESSAGES_BYTES_FACTOR times that for `messages` (old turns may be dropped).
    max_text_input_bytes: int = 0
    max_messages_bytes: int = 0  # the bound for `messages` (0: derived, as above)

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_messages_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("max_text_input_bytes", "max_messages_bytes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0 (0 derives it), got {getattr(self, name)}")


# Natural text averages 3-5 bytes per token (English, code, CJK alike); only
# contrived text (long runs of one character) packs more into a token.
BYTES_PER_TOKEN = 16
MESSAGES_BYTES_FACTOR = 4


@dataclass(frozen=True)
class BuiltPrompt:
    input_ids: list[int]
    # Whole turns removed by the context policy (0 for plain text).
    dropped_turns: int = 0
    from_messages: bool = False

    @property
    def num_input_tokens(self) -> int:
        return len(self.input_ids)


def _depth(value: Any) -> int:
    """Nesting depth of parsed JSON (iterative: the input is untrusted)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (list, dict)):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_messages(messages_json: str, max_depth: int = PromptConfig.max_messages_depth) -> list[dict[str, Any]]:
    """Validate the ``messages`` input: a JSON array of {role, content} objects."""
    too_deep = f"nested deeper than {max_depth} levels"
    try:
        messages = json.loads(messages_json)
    except json.JSONDecodeError as exc:
        raise InvalidInputError("messages", f"not valid JSON ({exc.msg} at position {exc.pos})") from None
    except RecursionError:  # the C decoder's own guard, far past any bound we allow
        raise InvalidInputError("messages", too_deep) from None
    if _depth(messages) > max_depth:
        raise InvalidInputError("messages", too_deep)
    if not isinstance(messages, list):
        raise InvalidInputError("messages", 'must be a JSON array of {"role", "content"} objects')
    if not messages:
        raise InvalidInputError("messages", "must not be empty")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidInputError("messages", f"item {index} must be an object with role and content")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidInputError("messages", f"item {index} has role {role!r}; expected one of {', '.join(ROLES)}")
        if not isinstance(message.get("content"), str):
            raise InvalidInputError("messages", f"item {index} ({role}) must have a string content")
    return messages


def _turn_starts(messages: list[dict[str, Any]]) -> list[int]:
    """Indexes where droppable turns start: each user message before the last
    one, plus a leading run of non-user replies (dropped as a turn of its own)."""
    user_indexes = [i for i, m in enumerate(messages) if m["role"] == "user"]
    if not user_indexes:
        return []
    starts = user_indexes[:-1]
    first_chat = next(i for i, m in enumerate(messages) if m["role"] != "system")
    if first_chat < user_indexes[0]:
        starts.insert(0, first_chat)
    return starts


def _drop_turns(messages: list[dict[str, Any]], starts: list[int], count: int) -> list[dict[str, Any]]:
    if count == 0:
        return messages
    # Every non-system message before the start of the first kept turn goes.
    keep_from = starts[count] if count < len(starts) else _last_user(messages)
    return [m for i, m in enumerate(messages) if i >= keep_from or m["role"] == "system"]


def _last_user(messages: list[dict[str, Any]]) -> int:
    return max(i for i, m in enumerate(messages) if m["role"] == "user")


def _check_size(field: str, text: str, limit: int) -> None:
    # a cheap bound first (a character is at most 4 bytes), the exact count only near the limit
    if len(text) * 4 > limit and (size := len(text.encode("utf-8"))) > limit:
        raise InvalidInputError(field, f"{size} bytes; at most {limit}")


class PromptBuilder:
    """Turns one request's text inputs into prompt ids; shared by all requests."""

    def __init__(self, info: TokenizerInfo, config: PromptConfig | None = None, max_context: int | None = None) -> None:
        """`max_context`: the engine's limit (its `max_model_len`) when smaller
        than the model's own."""
        self._info = info
        self._config = config or PromptConfig()
        if max_context is not None and max_context < 2:
            raise ValueError(f"max_context: must be >= 2, got {max_context}")
        max_context = max_context or info.max_context
        if max_context is None:
            raise ValueError(f"{info.model_dir}: unknown context length; set the engine's max_model_len")
        if info.max_context is not None:
            max_context = min(max_context, info.max_context)
        self.max_context = max_context
        self._template = (
            ChatTemplate(info.chat_template, info.special_tokens) if info.chat_template is not None else None
        )
        self.max_text_input_bytes = self._config.max_text_input_bytes or BYTES_PER_TOKEN * max_context
        self.max_messages_bytes = self._config.max_messages_bytes or MESSAGES_BYTES_FACTOR * self.max_text_input_bytes

    def build(self, text_input: str | None, messages_json: str | None, max_tokens: int) -> BuiltPrompt:
        """`max_tokens` was validated where it entered (`llm_request.py`); here
        it only has to leave room for a prompt."""
        if max_tokens >= self.max_context:
            raise InvalidInputError(
                "max_tokens", f"{max_tokens} leaves no room for a prompt in the context of {self.max_context}"
            )
        if messages_json:
            if text_input:
                raise InvalidInputError("text_input", "must be empty when messages is given")
            _check_size("messages", messages_json, self.max_messages_bytes)
            return self._build_chat(messages_json, max_tokens)
        if not text_input:
            raise InvalidInputError("text_input", "must not be empty (or give messages)")
        _check_size("text_input", text_input, self.max_text_input_bytes)
        ids = self._info.tokenizer.encode(text_input, add_special_tokens=True).ids
        if not ids:  # e.g. only control characters the tokenizer drops: nothing to continue
            raise InvalidInputError("text_input", "tokenizes to no tokens at all")
        if len(ids) + max_tokens > self.max_context:
            raise InvalidInputError(
                "text_input",
                f"prompt of {len(ids)} tokens + max_tokens {max_tokens} exceeds the context of {self.max_context}",
            )
        return BuiltPrompt(input_ids=ids)

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The chat prompt text, with the configured default system prompt."""
        if self._template is None:
            raise InvalidInputError("messages", "this model has no chat template; send text_input")
        default_system = self._config.default_system_prompt
        if default_system and not any(m["role"] == "system" for m in messages):
            messages = [{"role": "system", "content": default_system}, *messages]
        return self._template.render(messages, add_generation_prompt=True)

    def _encode_chat(self, messages: list[dict[str, Any]]) -> list[int]:
        # The template already wrote every special token (as HF's apply_chat_template does).
        return self._info.tokenizer.encode(self.render(messages), add_special_tokens=False).ids

    def _build_chat(self, messages_json: str, max_tokens: int) -> BuiltPrompt:
        messages = parse_messages(messages_json, self._config.max_messages_depth)
        if len(messages) > self._config.max_messages:
            raise InvalidInputError("messages", f"{len(messages)} messages; at most {self._config.max_messages}")
        budget = self.max_context - max_tokens
        ids = self._encode_chat(messages)
        if len(ids) <= budget:
            return BuiltPrompt(input_ids=ids, from_messages=True)

        starts = _turn_starts(messages)
        # Fewest dropped turns that fit; prompt length shrinks as more turns go,
        # so a binary search renders O(log turns) times instead of once per turn.
        low, high, best = 1, len(starts), None
        while low <= high:
            mid = (low + high) // 2
            candidate = self._encode_chat(_drop_turns(messages, starts, mid))
            if len(candidate) <= budget:
                best, high = (mid, candidate), mid - 1
            else:
                low = mid + 1
        if best is None:
            shortest = ids if not starts else self._encode_chat(_drop_turns(messages, starts, len(starts)))
            raise InvalidInputError(
                "messages",
                f"prompt of {len(shortest)} tokens (after dropping {len(starts)} "
                f"earlier turns) + max_tokens {max_tokens} exceeds the context "
                f"of {self.max_context}",
            )
        dropped, ids = best
        log.info("dropped turns to fit the context", extra={"dropped_turns": dropped, "prompt_tokens": len(ids)})
        return BuiltPrompt(input_ids=ids, dropped_turns=dropped, from_messages=True)
