"""Per-request incremental detokenization: token ids in, clean text deltas out.

The method is vLLM's prefix/read offsets (vLLM PR #984): decode a short window
of ids that starts a little before the new ones, and emit only what the
already emitted part of the window does not cover. Decoding with that bit of
context keeps the decoder's word-boundary rules right: a SentencePiece
decoder strips the space of a leading "▁" at the start of a text, so decoding
each token alone streams "Paris" "is" "nice" with the spaces lost, and adding
them back blindly doubles them elsewhere. Text ending in U+FFFD is an
incomplete UTF-8 character (a CJK character or an emoji spelled as several
byte tokens): the window only moves past a token boundary where the text is
whole, and the unfinished character is held back until its last byte arrives,
so a stream never shows U+FFFD where the full text has none. Work per token
is bounded by the window, never the whole output.

``tokenizers.decoders.DecodeStream`` does the same, but it cannot flush what it
holds back at the end of a stream, so the window is kept here.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"
# A UTF-8 character has at most 4 bytes, so a whole-text token boundary is
# normally found within a few ids of the end; look a little further for tokens
# that straddle characters.
_BOUNDARY_SEARCH_IDS = 8
# Past this many ids without a whole-text boundary the U+FFFD is real (invalid
# bytes from the model): emit it rather than let the window grow without end.
_MAX_PENDING_IDS = 64


class IncrementalDetokenizer:
    """One per request; ``push`` ids as they arrive, ``flush`` once at the end."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._special_ids: frozenset[int] = (
            frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
            if skip_special_tokens
            else frozenset()
        )
        # The window: ids[:read] end on a whole character and give context;
        # ids[read:] came after. The first `emitted` characters of the
        # window's text were already returned.
        self._ids: list[int] = []
        self._read = 0
        self._emitted = 0

    def push(self, token_ids: Iterable[int]) -> str:
        """Add generated ids; returns the text they complete (may be "")."""
        # Special tokens are dropped before decoding rather than by the decoder,
        # so they can never be a window's first token and shift where it starts.
        new_ids = [int(t) for t in token_ids if int(t) not in self._special_ids]
        if not new_ids:
            return ""
        self._ids.extend(new_ids)
        text = self._decode(self._ids)
        if not text.endswith(_REPLACEMENT):
            return self._advance(text, len(self._ids))
        # The text ends mid-character: find the last boundary where it is whole.
        lowest = max(self._read + 1, len(self._ids) - _BOUNDARY_SEARCH_IDS)
        for boundary in range(len(self._ids) - 1, lowest - 1, -1):
            head = self._decode(self._ids[:boundary])
            if not head.endswith(_REPLACEMENT):
                return self._advance(head, boundary)
        if len(self._ids) - self._read > _MAX_PENDING_IDS:
            return self._advance(text, len(self._ids))
        # Tokens straddling characters: emit what is already final, keep the window.
        return self._take(text.rstrip(_REPLACEMENT))

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes to U+FFFD)."""
        if not self._ids:
            return ""
        delta = self._take(self._decode(self._ids))
        self._ids, self._read, self._emitted = [], 0, 0
        return delta

    def _take(self, text: str) -> str:
        delta = text[self._emitted :]
        self._emitted = max(self._emitted, len(text))
        return delta

    def _advance(self, text: str, boundary: int) -> str:
        """Emit ``text`` (the window's text up to ``boundary``) and start the
        next window at the previous boundary, so it has context."""
        delta = self._take(text)
        self._ids = self._ids[self._read :]
        self._read = boundary - self._read
        self._emitted = len(self._decode(self._ids[: self._read]))
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)
