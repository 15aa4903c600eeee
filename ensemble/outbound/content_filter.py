"""Operator-configured output blocklist: plain words and regular expressions
(Chinese included), each either masked (``*`` per character) or ending the
response with ``finish_reason: content_filter``.

Rules are matched over a sliding window across token boundaries: "危" + "险"
arriving as two tokens is still "危险". The ``regex`` module's partial matching
says exactly which tail of the text could still become a match, so only that
tail is held back (bounded by ``max_hold_chars``), never a fixed-size window.

Rule file format (JSON): a list of objects, or ``{"rules": [...]}``, each
``{"pattern": str, "action": "mask"|"stop", "regex": bool, "ignore_case": bool,
"name": str}``; only ``pattern`` is required.
"""

from __future__ import annotations

import enum
import json
import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regex

log = logging.getLogger(__name__)


class FilterAction(enum.Enum):
    MASK = "mask"
    STOP = "stop"


@dataclass(frozen=True)
class FilterRule:
    pattern: str
    action: FilterAction = FilterAction.MASK
    is_regex: bool = False
    ignore_case: bool = True
    name: str = ""

    def __post_init__(self) -> None:
        if not self.pattern:
            raise ValueError("a content filter rule needs a non-empty pattern")
        if not isinstance(self.action, FilterAction):
            object.__setattr__(self, "action", FilterAction(self.action))
        compiled = self.compile()
        if compiled.fullmatch(""):
            raise ValueError(f"content filter rule {self.label!r} matches the empty string")

    @property
    def label(self) -> str:
        return self.name or self.pattern

    def source(self) -> str:
        body = self.pattern if self.is_regex else regex.escape(self.pattern)
        return f"(?i:{body})" if self.ignore_case else f"(?:{body})"

    def compile(self) -> regex.Pattern[str]:
        try:
            return regex.compile(self.source(), regex.V1)
        except regex.error as exc:
            raise ValueError(f"content filter rule {self.label!r}: bad regular expression: {exc}") from None

    @classmethod
    def from_dict(cls, item: Mapping[str, Any]) -> FilterRule:
        unknown = set(item) - {"pattern", "action", "regex", "ignore_case", "name"}
        if unknown:
            raise ValueError(f"content filter rule has unknown keys {sorted(unknown)}")
        pattern = item.get("pattern")
        if not isinstance(pattern, str):
            raise ValueError(f"content filter rule needs a string pattern, got {pattern!r}")
        return cls(
            pattern=pattern,
            action=FilterAction(item.get("action", "mask")),
            is_regex=bool(item.get("regex", False)),
            ignore_case=bool(item.get("ignore_case", True)),
            name=str(item.get("name", "")),
        )


@dataclass(frozen=True)
class FilterResult:
    text: str
    stopped: bool = False
    # The rule that stopped the response (for logs and metrics; never the text).
    rule: str | None = None


def _combined(rules: Iterable[FilterRule]) -> regex.Pattern[str] | None:
    sources = [r.source() for r in rules]
    # Longer alternatives first: at one position the longest word should win the mask.
    sources.sort(key=len, reverse=True)
    return regex.compile("|".join(sources), regex.V1) if sources else None


class ContentFilterRules:
    """The compiled rule set, shared by all requests; ``new_filter()`` per request."""

    def __init__(self, rules: Sequence[FilterRule], max_hold_chars: int = 64) -> None:
        if max_hold_chars < 1:
            raise ValueError(f"max_hold_chars must be >= 1, got {max_hold_chars}")
        self.rules = tuple(rules)
        self.max_hold_chars = max_hold_chars
        self.mask_pattern = _combined(r for r in self.rules if r.action is FilterAction.MASK)
        self.stop_pattern = _combined(r for r in self.rules if r.action is FilterAction.STOP)
        self._stop_rules = [(r, r.compile()) for r in self.rules if r.action is FilterAction.STOP]

    @classmethod
    def from_dicts(cls, items: Iterable[Mapping[str, Any]], max_hold_chars: int = 64) -> ContentFilterRules:
        return cls([FilterRule.from_dict(item) for item in items], max_hold_chars=max_hold_chars)

    @classmethod
    def from_json_file(cls, path: str | os.PathLike[str], max_hold_chars: int = 64) -> ContentFilterRules:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        items = data.get("rules") if isinstance(data, dict) else data
        if not isinstance(items, list):
            raise ValueError(f'{path}: expected a list of rules or {{"rules": [...]}}')
        rules = cls.from_dicts(items, max_hold_chars=max_hold_chars)
        log.info("content filter rules loaded", extra={"path": str(path), "rules": len(rules.rules)})
        return rules

    def __bool__(self) -> bool:
        return bool(self.rules)

    def rule_for(self, matched: str) -> str:
        for rule, compiled in self._stop_rules:
            if compiled.fullmatch(matched):
                return rule.label
        return "?"

    def new_filter(self) -> ContentFilter:
        return ContentFilter(self)


def _apply_masks(text: str, spans: list[tuple[int, int]]) -> str:
    if not spans:
        return text
    chars = list(text)
    for start, end in spans:
        chars[start:end] = "*" * (end - start)
    return "".join(chars)


class ContentFilter:
    """One per request: ``push`` text deltas, ``flush`` at the end."""

    def __init__(self, rules: ContentFilterRules) -> None:
        self._rules = rules
        self._held = ""
        self._stopped = False

    def push(self, text: str) -> FilterResult:
        if self._stopped:
            return FilterResult("", stopped=True)
        buffer = self._held + text
        if not buffer:
            return FilterResult("")
        hold_from = len(buffer)
        stop_match = None
        if self._rules.stop_pattern is not None:
            match = next(self._rules.stop_pattern.finditer(buffer, partial=True), None)
            if match is not None and match.partial:
                if match.start() < len(buffer):  # an empty partial at the very end means nothing
                    hold_from = match.start()
            elif match is not None:
                stop_match = match
        if stop_match is not None:
            return self._stop(buffer, stop_match)

        spans: list[tuple[int, int]] = []
        if self._rules.mask_pattern is not None:
            for match in self._rules.mask_pattern.finditer(buffer, partial=True):
                if match.partial or match.end() == len(buffer):
                    # A match touching the end may still grow ("\d+"): wait for more text.
                    if match.start() < len(buffer):
                        hold_from = min(hold_from, match.start())
                    break
                spans.append(match.span())
        # Bounded window: a partial match older than max_hold_chars is given up.
        hold_from = max(hold_from, len(buffer) - self._rules.max_hold_chars)
        for start, end in spans:
            if start < hold_from < end:
                hold_from = start  # never emit half a masked match
        self._held = buffer[hold_from:]
        return FilterResult(_apply_masks(buffer[:hold_from], [s for s in spans if s[1] <= hold_from]))

    def flush(self) -> FilterResult:
        held, self._held = self._held, ""
        if self._stopped or not held:
            return FilterResult("", stopped=self._stopped)
        if self._rules.stop_pattern is not None:
            match = self._rules.stop_pattern.search(held)
            if match is not None:
                return self._stop(held, match)
        return FilterResult(self._mask_complete(held))

    def _stop(self, buffer: str, match: regex.Match[str]) -> FilterResult:
        self._stopped = True
        self._held = ""
        rule = self._rules.rule_for(match.group())
        log.info("content filter stopped a response", extra={"rule": rule})
        return FilterResult(self._mask_complete(buffer[: match.start()]), stopped=True, rule=rule)

    def _mask_complete(self, text: str) -> str:
        if self._rules.mask_pattern is None:
            return text
        return _apply_masks(text, [m.span() for m in self._rules.mask_pattern.finditer(text)])
