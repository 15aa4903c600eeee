"""One request's output path: ids → text → stop strings → content filter →
segments, with one finish reason at the end.

A text stage that ends the response (a stop string, a ``stop`` filter rule)
flushes everything before it at once, and its reason wins over the engine's;
the adapter then stops the engine request so its KV is freed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from .content_filter import ContentFilter, ContentFilterRules
from .detokenizer import IncrementalDetokenizer
from .segmenter import Segmenter, SegmentMode
from .stop_strings import StopStringMatcher

FINISH_STOP = "stop"
FINISH_CONTENT_FILTER = "content_filter"


@dataclass(frozen=True)
class Emission:
    text: str
    # Set once the response is over: by a text stage on push, by finish() otherwise.
    finish_reason: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True)
class OutputConfig:
    stop_strings: Sequence[str] = ()
    segment: SegmentMode = SegmentMode.TOKEN
    skip_special_tokens: bool = True
    content_filter: ContentFilterRules | None = None


class OutputPipeline:
    """One per request; feed it ids in order, then call ``finish`` exactly once."""

    def __init__(self, tokenizer: Tokenizer, config: OutputConfig | None = None) -> None:
        config = config or OutputConfig()
        self._detokenizer = IncrementalDetokenizer(tokenizer, skip_special_tokens=config.skip_special_tokens)
        self._stops = StopStringMatcher(config.stop_strings)
        self._filter: ContentFilter | None = config.content_filter.new_filter() if config.content_filter else None
        self._segmenter = Segmenter(config.segment)
        self._finish_reason: str | None = None
        self._done = False

    @property
    def finish_reason(self) -> str | None:
        """The reason a text stage ended the response, if one did."""
        return self._finish_reason

    def prime(self, token_ids: Iterable[int]) -> None:
        """Replay output another replica already streamed for this request (a
        migrated stream) and drop its text: the client has it. Every stage
        then holds what that replica's pipeline held (an incomplete character,
        a possible start of a stop string or a filter match, an unfinished
        segment), so the next delta continues the text cleanly, and a stop
        string spanning the switch still stops with none of it emitted.

        One id at a time, as the LLM step streamed them (one token a step):
        how far the detokenizer has emitted depends on how its input was cut
        (text after the last whole-token boundary goes out early), so a
        single push could leave it behind that replica and repeat text."""
        for token_id in token_ids:
            self.push((token_id,))

    def push(self, token_ids: Iterable[int]) -> Emission:
        if self._finish_reason is not None:
            return Emission("", self._finish_reason)
        return self._through_stages(self._detokenizer.push(token_ids), end_of_stream=False)

    def finish(self, engine_finish_reason: str | None) -> Emission:
        """Flush everything held back; the reason is a text stage's if one
        ended the response, else the engine's."""
        if self._done or self._finish_reason is not None:
            self._done = True
            return Emission("", self._finish_reason or engine_finish_reason)
        self._done = True
        emission = self._through_stages(self._detokenizer.flush(), end_of_stream=True)
        return Emission(emission.text, self._finish_reason or engine_finish_reason)

    def _through_stages(self, text: str, end_of_stream: bool) -> Emission:
        stop = self._stops.push(text)
        text = stop.text
        if stop.stopped:
            self._finish_reason = FINISH_STOP
        elif end_of_stream:
            text += self._stops.flush().text  # a held partial match was no stop after all
        ended = stop.stopped or end_of_stream

        if self._filter is not None:
            filtered = self._filter.push(text)
            text = filtered.text
            if not filtered.stopped and ended:
                filtered = self._filter.flush()
                text += filtered.text
            if filtered.stopped:
                # The filter's hit lies before any stop string (it only saw text before it).
                self._finish_reason = FINISH_CONTENT_FILTER
                ended = True

        text = self._segmenter.push(text)
        if ended:
            text += self._segmenter.flush()
        return Emission(text, self._finish_reason)
