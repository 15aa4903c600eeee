"""Render a model's Jinja chat template the way Hugging Face's
``apply_chat_template`` does, without importing transformers per request.

Chat templates ship with downloaded models, i.e. they are untrusted code: they
run in Jinja's immutable sandbox with the same small set of helpers HF offers
(``raise_exception``, ``tojson``, ``strftime_now``, loop controls), so templates
written for HF render identically here.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from contract.errors import InvalidInputError


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters, which changes the prompt text.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """Accepts HF's ``{% generation %}...{% endgeneration %}`` and renders its body as is."""

    tags = {"generation"}

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return caller()


class ChatTemplate:
    """One compiled chat template; ``render`` is safe to call from many threads."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        if not source.strip():
            raise ValueError("the chat template is empty")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self._template = env.from_string(source)
        self._special_tokens = dict(special_tokens or {})

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """The prompt text; a template's own rejection (e.g. roles that do not
        alternate) is the client's error, reported against ``messages``."""
        try:
            return self._template.render(
                messages=messages,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self._special_tokens,
            )
        except jinja2.exceptions.TemplateError as exc:
            raise InvalidInputError("messages", f"rejected by the model's chat template: {exc}") from None
