"""Per-request incremental detokenization: token ids in, clean text deltas out.

The method is vLLM's prefix/read offsets (vLLM PR #984): decode a short window
of ids twice, with and without the newest ones, and emit only the difference.
Decoding from a little context before the new ids keeps the decoder's
word-boundary rules (SentencePiece's "▁" → space, stripped only at the very
start) correct, so spaces are neither lost nor doubled (field-notes row 2);
and text ending in U+FFFD means a UTF-8 character is still incomplete, so it is
held back until its last byte arrives (row 1). Work per token is bounded by
the window, never the whole output.

``tokenizers.decoders.DecodeStream`` does the same, but it cannot flush what it
holds back at the end of a stream, so the window is kept here.
"""
from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer

_REPLACEMENT = "\ufffd"
# More ids than a UTF-8 character can need (4 bytes, one id each): the U+FFFD
# is then real (invalid bytes), and holding back longer would stall the stream.
_MAX_PENDING_IDS = 8


class IncrementalDetokenizer:
    """One per request; ``push`` ids as they arrive, ``flush`` once at the end."""

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special = skip_special_tokens
        self._special_ids: frozenset[int] = (
            frozenset(i for i, t in tokenizer.get_added_tokens_decoder().items() if t.special)
            if skip_special_tokens else frozenset())
        # The window: ids[:read] were already emitted and only give context;
        # ids[read:] are not emitted yet.
        self._ids: list[int] = []
        self._read = 0
        self._prefix_text = ""

    def push(self, token_ids: Iterable[int]) -> str:
        """Add generated ids; returns the text they complete (may be "")."""
        # Special tokens are dropped before decoding rather than by the decoder,
        # so they can never become a window's first token and shift its start.
        new_ids = [int(t) for t in token_ids if int(t) not in self._special_ids]
        if not new_ids:
            return ""
        self._ids.extend(new_ids)
        text = self._decode(self._ids)
        if text.endswith(_REPLACEMENT) and len(self._ids) - self._read < _MAX_PENDING_IDS:
            return ""
        return self._advance(text)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character decodes to U+FFFD)."""
        if self._read == len(self._ids):
            return ""
        return self._advance(self._decode(self._ids))

    def _advance(self, text: str) -> str:
        # The window's context decodes the same with or without the new ids
        # (it ended on a whole character), so the delta is a plain suffix.
        delta = text[len(self._prefix_text):]
        # The ids just emitted become the next window's context.
        self._ids = self._ids[self._read:]
        self._read = len(self._ids)
        self._prefix_text = self._decode(self._ids)
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=False)
