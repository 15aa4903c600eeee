"""One streaming generation: retries before the first response, LLM-shaped
timeouts after it, and cleanup however the stream ends: close, then `stop` with
the request key (Triton directly) or the gateway's cancel (with an api_key)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from .errors import ClientTimeoutError, FirstTokenTimeoutError, RequestError, ServerConnectionError, TokenTimeoutError
from .retry import build_retrying
from .timing import Timings
from .transport import ResponseStream
from .types import GenerationResult, StreamEvent

if TYPE_CHECKING:
    from .client import AsyncLLMClient

log = logging.getLogger(__name__)
# A stop for a request the engine no longer knows is expected after a race (it
# finished while the stop was on its way): the server answers "stop: no live
# request has this request_key (unknown request or already finished)".
_ALREADY_FINISHED_HINTS = (
    "no live request",
    "already finished",
    "unknown request",
    "not found",
    "no such request",
    "unknown id",
)
_KEY_PLACEHOLDER = "<request_key>"


def already_finished(exc: RequestError) -> bool:
    """Whether a stop's refusal says the request is no longer running."""
    return any(hint in exc.message.lower() for hint in _ALREADY_FINISHED_HINTS)


def redact(text: str, request_key: str) -> str:
    """`text` with the key masked: server messages may quote it, and logs must not."""
    return text.replace(request_key, _KEY_PLACEHOLDER) if request_key else text


class GenerationStream:
    """Async iterator of `StreamEvent`s; `result` fills in as events arrive.

    Use as `async with client.stream(...) as s: async for event in s: ...` or
    call `aclose()`; leaving early (break, cancellation, timeout) closes the
    stream and, for the ensemble, sends `stop` so the engine frees the request;
    through the gateway it cancels there instead (ResponseStream.cancel).
    """

    def __init__(
        self, client: AsyncLLMClient, model: str, values: dict[str, Any], request_id: str, request_key: str
    ) -> None:
        self._client = client
        self._model = model
        self._values = values
        self.request_id = request_id
        self.result = GenerationResult(
            request_id=request_id,
            model=model,
            transport=client.transport_name,
            timings=Timings(sent_s=client.clock()),
            request_key=request_key,
        )
        self._events = self._run()

    @property
    def request_key(self) -> str:
        """The secret that stops this request: the key sent, or the one the server echoed."""
        return self.result.request_key

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> StreamEvent:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    async def __aenter__(self) -> GenerationStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def collect(self) -> GenerationResult:
        """Read the stream to its end and return the whole result."""
        async with self:
            async for _ in self:
                pass
        return self.result

    async def _run(self) -> AsyncGenerator[StreamEvent, None]:
        stream: ResponseStream | None = None
        server_done = False  # True once the server can no longer be working on it
        try:
            stream, event = await self._open_with_retries()
            while event is not None:
                self._check_echo(event)
                self.result.add(event)
                self.result.resumes = _resumes(stream)
                server_done = event.final or event.finish_reason is not None
                yield event
                if event.final:
                    break
                event = await self._next(stream)
            server_done = True
        except RequestError as exc:
            server_done = True  # rejected up front, or ended by the server with an error
            if self.result.num_responses == 0:
                raise
            self._fail(exc.message)
        except ServerConnectionError as exc:
            if self.result.num_responses == 0:
                server_done = True  # never reached the server
                raise
            self._fail(str(exc))  # the connection broke mid-stream; the engine may still run
        except ClientTimeoutError as exc:
            self.result.finish_reason = "timeout"
            self.result.error = str(exc)
            exc.result = self.result
            raise
        except (asyncio.CancelledError, GeneratorExit):
            if not server_done:
                self.result.finish_reason = "cancelled"
            raise
        finally:
            self.result.timings.finish(self._client.clock())
            if stream is not None:
                await stream.aclose()
                self.result.resumes = _resumes(stream)
                if not server_done and self._client.config.through_gateway:
                    await asyncio.shield(self._cancel_at_gateway(stream))
            if not server_done and self._client.config.sends_stop_on_cancel:
                # Shielded: a second cancellation must not lose the stop.
                await asyncio.shield(self._send_stop())

    def _check_echo(self, event: StreamEvent) -> None:
        # The server echoes the key it registered the request under; were it a
        # different one (it must not be), only that one could stop the request.
        echoed = event.request_key
        if echoed and echoed != self.result.request_key:
            log.warning(
                "request %s: the server echoed a request_key other than the one sent; stopping with the echoed one",
                self.request_id,
            )
            self.result.request_key = echoed

    def _fail(self, message: str) -> None:
        self.result.finish_reason = "error"
        self.result.error = redact(message, self.request_key)  # the result is printed and logged
        log.warning("stream %s ended with an error after %d response(s)", self.request_id, self.result.num_responses)

    async def _open_with_retries(self) -> tuple[ResponseStream, StreamEvent | None]:
        client = self._client
        client.budget.record_request()
        retrying = build_retrying(client.config.retry, client.budget, client.sleep)
        async for attempt in retrying:
            with attempt:
                self.result.attempts = attempt.retry_state.attempt_number
                return await self._open_once()
        raise AssertionError("unreachable: tenacity either returns or raises")  # pragma: no cover

    async def _open_once(self) -> tuple[ResponseStream, StreamEvent | None]:
        limit = self._client.config.timeouts.first_token_s
        started = self._client.clock()
        try:
            stream = await asyncio.wait_for(
                self._client.transport.open_stream(self._model, self._values, self.request_id), limit
            )
        except TimeoutError:
            raise FirstTokenTimeoutError(f"no response within {limit}s (first-token timeout)") from None
        try:
            remaining = None if limit is None else max(0.0, limit - (self._client.clock() - started))
            first = await asyncio.wait_for(stream.next_event(), remaining)
        except TimeoutError:
            await self._discard(stream)
            raise FirstTokenTimeoutError(f"no response within {limit}s (first-token timeout)") from None
        except RequestError:
            await stream.aclose()  # the server ended it: nothing left to cancel
            raise
        except BaseException:
            await self._discard(stream)
            raise
        return stream, first

    async def _discard(self, stream: ResponseStream) -> None:
        """Close a stream that gave no first event. Through the gateway also
        cancel it: a retry starts a new one, and this one would otherwise run on
        for the gateway's grace period. (Triton directly: `_run` sends the stop.)"""
        await stream.aclose()
        if self._client.config.through_gateway:
            await asyncio.shield(self._cancel_at_gateway(stream))

    async def _next(self, stream: ResponseStream) -> StreamEvent | None:
        limit = self._client.config.timeouts.token_s
        try:
            return await asyncio.wait_for(stream.next_event(), limit)
        except TimeoutError:
            raise TokenTimeoutError(
                f"no response for {limit}s after {self.result.num_responses} response(s) (per-token timeout)"
            ) from None

    async def _cancel_at_gateway(self, stream: ResponseStream) -> None:
        try:
            await stream.cancel()
        except Exception as exc:  # best effort, as the stop: the gateway's grace period bounds the waste
            log.warning(
                "cancel of request %s at the gateway failed: %s", self.request_id, redact(repr(exc), self.request_key)
            )

    async def _send_stop(self) -> None:
        config = self._client.config
        key = self.request_key
        try:
            await self._client.transport.send_stop(config.stop_model, self.request_id, key)
            log.debug("sent stop for request %s", self.request_id)
        except RequestError as exc:
            if already_finished(exc):
                log.debug("stop for %s: request already finished", self.request_id)
            else:
                log.warning("stop for request %s failed: %s", self.request_id, redact(str(exc), key))
        except Exception as exc:  # best effort: a failed stop must not mask the caller's outcome
            log.warning("stop for request %s failed: %s", self.request_id, redact(repr(exc), key))


def _resumes(stream: ResponseStream) -> int:
    # Transports outside this package (the gateway's test fakes) may predate resume.
    return getattr(stream, "resumes", 0)
