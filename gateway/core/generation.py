"""The engine requests behind one OpenAI request: `n` choices (times the
prompts of a completions batch) fanned out as separate engine requests, their
events merged in arrival order, exact usage and the caller's token budget.

Usage is exact: prompt tokens are the engine's `num_input_tokens` (once per
prompt: the choices of one prompt share it, and the prefix cache computes it
once), completion tokens are the output ids the engine streamed. Tokens reach
the caller's admission as they flow, with every response (the policy batches
them for a shared store)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

from client import StreamEvent

from ..ops.metrics import ADDED_LATENCY, ITL, TTFT
from .engine_request import UpstreamRequest
from .errors import GatewayError
from .policy import Admission
from .upstream import Upstream, UpstreamStream


@dataclass
class ChoiceState:
    index: int
    prompt_index: int
    text: list[str] = field(default_factory=list)
    engine_finish: str | None = None
    completion_tokens: int = 0
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    last_content_s: float | None = None


def event_logprobs(event: StreamEvent) -> list[float]:
    rows = event.output_log_probs or ()
    return [value for row in rows for value in row]


class Generation:
    def __init__(
        self,
        upstream: Upstream,
        model: str,
        requests: list[UpstreamRequest],
        admission: Admission,
        *,
        route: str,
        started_s: float,
        prompt_estimate: int = 0,
        keep_logprobs: bool = False,
        streamed: bool = True,
        streaming: bool = True,
    ) -> None:
        self._upstream = upstream
        self._model = model
        self._requests = requests
        self._admission = admission
        self._ttft, self._itl = TTFT.labels(route=route), ITL.labels(route=route)
        self._started_s = started_s
        self._prompt_estimate = prompt_estimate
        self._keep_logprobs = keep_logprobs  # a whole (non-streamed) answer lists them at the end
        self._streamed = streamed
        # the engine requests' `stream` input: False asks for one whole answer
        # (Triton's generate / infer routes), True for deltas
        self._streaming = streaming
        self.choices = [ChoiceState(r.index, r.prompt_index) for r in requests]
        self._streams: list[UpstreamStream] = []
        self._prompt_tokens: dict[int, int] = {}
        self._uncharged = 0  # tokens streamed and not yet handed to the admission
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def prompt_tokens(self) -> int:
        return sum(self._prompt_tokens.values())

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    async def start(self) -> None:
        """Send every engine request and wait for each one's first response;
        any refusal closes the others and is raised as the caller's answer."""
        ADDED_LATENCY.labels(phase="request").observe(time.perf_counter() - self._started_s)
        starts = [
            asyncio.ensure_future(self._upstream.start(self._model, r.text_input, r.options, streaming=self._streaming))
            for r in self._requests
        ]
        try:
            await asyncio.wait(starts, return_when=asyncio.FIRST_EXCEPTION)
        except BaseException:
            for task in starts:
                task.cancel()
            await self._close_started(starts)
            raise
        failed = next((t.exception() for t in starts if t.done() and t.exception() is not None), None)
        if failed is not None:
            for task in starts:
                task.cancel()
            await self._close_started(starts)
            raise failed
        self._streams = [task.result() for task in starts]
        for choice, stream in zip(self.choices, self._streams):
            self._prompt_tokens.setdefault(choice.prompt_index, stream.first.num_input_tokens or 0)
        # the admission was charged an estimate; the real prompt count corrects it upward
        extra = self.prompt_tokens - self._prompt_estimate
        if extra > 0:
            await self._admission.add_tokens(extra)

    @staticmethod
    async def _close_started(starts: Sequence[asyncio.Future[UpstreamStream]]) -> None:
        await asyncio.gather(*starts, return_exceptions=True)
        for task in starts:
            if not task.cancelled() and task.exception() is None:
                await task.result().aclose()

    async def events(self) -> AsyncIterator[tuple[ChoiceState, StreamEvent]]:
        """(choice, event) in arrival order, every choice to its end; raises
        UpstreamFailure when an engine request breaks off. An event's tokens
        are charged to the admission after its chunk is out (the limiter's
        work is not on the caller's latency), at the latest by aclose()."""
        for position, (choice, stream) in enumerate(zip(self.choices, self._streams)):
            self._account(choice, stream.first)
            yield choice, stream.first
            if position == 0 and self._streamed:
                # back here once the first chunk is written: the engine's first
                # response (client-library clock) to the caller's first bytes
                ADDED_LATENCY.labels(phase="first_chunk").observe(time.perf_counter() - stream.first.received_s)
            await self._charge()
        events = self._streams[0].rest() if len(self._streams) == 1 else None
        if events is not None:
            async for event in events:
                self._account(self.choices[0], event)
                yield self.choices[0], event
                await self._charge()
        else:
            async for choice, event in self._merged():
                self._account(choice, event)
                yield choice, event
                await self._charge()

    async def _merged(self) -> AsyncIterator[tuple[ChoiceState, StreamEvent]]:
        # None: a stream ended
        queue: asyncio.Queue[tuple[ChoiceState, StreamEvent] | Exception | None] = asyncio.Queue()

        async def pump(choice: ChoiceState, stream: UpstreamStream) -> None:
            try:
                async for event in stream.rest():
                    queue.put_nowait((choice, event))
                queue.put_nowait(None)
            except Exception as exc:  # handed to the consumer, which raises it
                queue.put_nowait(exc)

        self._tasks = [asyncio.create_task(pump(c, s)) for c, s in zip(self.choices, self._streams)]
        remaining = len(self._tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item

    def _account(self, choice: ChoiceState, event: StreamEvent) -> None:
        now = time.perf_counter()
        if event.text:
            if choice.last_content_s is None:
                self._ttft.observe(now - self._started_s)
            else:
                self._itl.observe(now - choice.last_content_s)
            choice.last_content_s = now
            choice.text.append(event.text)
        count = len(event.output_ids)
        choice.completion_tokens += count
        if self._keep_logprobs:
            choice.token_ids.extend(event.output_ids)
            choice.logprobs.extend(event_logprobs(event))
        if event.finish_reason:
            choice.engine_finish = event.finish_reason
        self._uncharged += count

    async def _charge(self) -> None:
        if self._uncharged:
            count, self._uncharged = self._uncharged, 0
            await self._admission.add_tokens(count)

    async def aclose(self) -> None:
        """However the request ended: engine requests still running are closed
        (and, through the client library, stopped by key), every streamed
        token is charged."""
        for task in self._tasks:
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(s.aclose() for s in self._streams), return_exceptions=True)
        await self._charge()


def engine_failure(choice: ChoiceState) -> GatewayError | None:
    """An engine finish that is a failure, as the error the caller gets."""
    reason = choice.engine_finish
    if reason in (None, "stop", "length", "content_filter"):
        return None
    if reason == "timeout":
        return GatewayError(504, "The engine timed out waiting for the next token.", code="upstream_timeout")
    return GatewayError(502, f"The engine request ended with '{reason}'.", code="upstream_error")
