"""The `postprocessing` step's logic, without Triton: one LLM response in,
one text delta out, with the stream's OutputPipeline carried between calls
through a StateStore (see shared_state.py for why and how)."""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from .content_filter import ContentFilterRules
from .output_pipeline import OutputConfig, OutputPipeline
from .segmenter import SegmentMode
from .shared_state import StateStore

# Objects shared by every stream are pickled by reference, not by value: the
# tokenizer alone is megabytes, and it is the same in every instance.
_TOKENIZER_REF = "tokenizer"
_FILTER_REF = "content_filter_rules"


@dataclass(frozen=True)
class LLMDelta:
    key: str
    token_ids: Sequence[int]
    sequence_length: int  # tokens generated so far, this delta included
    engine_finish_reason: str | None
    streaming: bool


@dataclass(frozen=True)
class StepResult:
    text: str
    finish_reason: str | None  # set on the stream's last response only
    stop_engine: bool  # a text stage ended the stream: free the engine request


class StreamPostprocessor:
    def __init__(
        self,
        tokenizer: Tokenizer,
        store: StateStore,
        content_filter: ContentFilterRules | None = None,
        order_wait_s: float = 30.0,
    ) -> None:
        self._tokenizer = tokenizer
        self._store = store
        self._filter = content_filter
        self._order_wait_s = order_wait_s

    def new_pipeline(
        self, stop_strings: Sequence[str], segment: str | None, primed_ids: Sequence[int] = ()
    ) -> OutputPipeline:
        """A stream's pipeline; `primed_ids`: a continuation's ids, replayed
        first (OutputPipeline.prime; RequestContext.primed_ids)."""
        pipeline = OutputPipeline(
            self._tokenizer,
            OutputConfig(
                stop_strings=tuple(stop_strings), segment=SegmentMode.parse(segment), content_filter=self._filter
            ),
        )
        if primed_ids:
            pipeline.prime(primed_ids)
        return pipeline

    def process(
        self,
        delta: LLMDelta,
        stop_strings: Sequence[str] = (),
        segment: str | None = None,
        primed_ids: Sequence[int] = (),
    ) -> StepResult:
        if not delta.streaming:
            pipeline = self.new_pipeline(stop_strings, segment, primed_ids)
            first = pipeline.push(delta.token_ids)
            last = pipeline.finish(delta.engine_finish_reason or None)
            return StepResult(first.text + last.text, last.finish_reason, False)

        start = max(0, delta.sequence_length - len(delta.token_ids))
        blob = self._store.load(delta.key, start, self._order_wait_s)
        if blob is not None:
            pipeline = self._loads(blob)
            already_ended = pipeline.finish_reason is not None
        else:
            # the stream's first delta; a stop the primed continuation already
            # holds is news to the engine, which must still be stopped
            pipeline = self.new_pipeline(stop_strings, segment, primed_ids)
            already_ended = False
        emission = pipeline.push(delta.token_ids)
        if delta.engine_finish_reason:
            final = pipeline.finish(delta.engine_finish_reason)
            self._store.delete(delta.key)
            return StepResult(emission.text + final.text, final.finish_reason, False)
        self._store.save(delta.key, delta.sequence_length, self._dumps(pipeline))
        # The contract puts finish_reason on the last response only: a text
        # stage's stop is reported when the engine's final response comes by.
        ended_now = pipeline.finish_reason is not None and not already_ended
        return StepResult(emission.text, None, ended_now)

    def _dumps(self, pipeline: OutputPipeline) -> bytes:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        shared = {id(self._tokenizer): _TOKENIZER_REF, id(self._filter): _FILTER_REF}
        # type-ignored below: pickle's documented hook: assign persistent_id on the instance
        pickler.persistent_id = lambda obj: shared.get(id(obj)) if obj is not None else None  # type: ignore[method-assign]
        pickler.dump(pipeline)
        return buffer.getvalue()

    def _loads(self, blob: bytes) -> OutputPipeline:
        unpickler = pickle.Unpickler(io.BytesIO(blob))
        refs = {_TOKENIZER_REF: self._tokenizer, _FILTER_REF: self._filter}
        # type-ignored below: pickle's documented hook: assign persistent_load on the instance
        unpickler.persistent_load = refs.__getitem__  # type: ignore[method-assign]
        return unpickler.load()
