"""The ``segment`` request option: stream tokens as they come, or whole
sentences, or whole paragraphs (for text-to-speech and UIs that render blocks).

A sentence ends at ``。！？`` (CJK needs no space after it) or at ``.!?``
followed by whitespace, with any closing quotes or brackets after the mark
kept in that sentence; ".5" or "e.g.x" never split. A paragraph ends at a blank
line. Sentence mode also ends a sentence at a blank line, so a heading or list
without punctuation is never held to the end.
"""

from __future__ import annotations

import enum
import re

from contract.errors import InvalidInputError


class SegmentMode(enum.Enum):
    TOKEN = "token"
    SENTENCE = "sentence"
    PARAGRAPH = "paragraph"

    @classmethod
    def parse(cls, value: str | None) -> SegmentMode:
        """The request's ``segment`` input; empty or missing means ``token``."""
        if not value:
            return cls.TOKEN
        try:
            return cls(value.strip().lower())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise InvalidInputError("segment", f"must be one of {choices}; got {value!r}") from None


_CLOSERS = "\"'”’)]}」』）】》"
_BLANK_LINE = r"\n[ \t]*\n"
# The end of a finished sentence (the boundary character itself stays in the buffer).
_SENTENCE_END = re.compile(rf"[。！？][{re.escape(_CLOSERS)}]*|[.!?][{re.escape(_CLOSERS)}]*(?=\s)|{_BLANK_LINE}")
_PARAGRAPH_END = re.compile(_BLANK_LINE)


class Segmenter:
    """One per request: ``push`` text, get back the finished segments (maybe "")."""

    def __init__(self, mode: SegmentMode = SegmentMode.TOKEN) -> None:
        self.mode = mode
        self._pattern = {SegmentMode.SENTENCE: _SENTENCE_END, SegmentMode.PARAGRAPH: _PARAGRAPH_END}.get(mode)
        self._held = ""

    def push(self, text: str) -> str:
        if self._pattern is None:
            return text
        buffer = self._held + text
        cut = self._last_end(buffer)
        self._held = buffer[cut:]
        return buffer[:cut]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _last_end(self, buffer: str) -> int:
        cut = 0
        # type-ignored below: only called when a segment mode (hence a pattern) is set
        for match in self._pattern.finditer(buffer):  # type: ignore[union-attr]
            # A CJK mark or a closer at the very end may still be followed by
            # more closers; wait for the next character before cutting there.
            if match.end() == len(buffer) and self.mode is SegmentMode.SENTENCE and buffer[-1] != "\n":
                break
            cut = match.end()
        return cut
