"""A thin blocking wrapper: the async client runs on a private event loop thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

from .client import AsyncLLMClient
from .config import ClientConfig
from .types import GenerationOptions, GenerationResult, StreamEvent

T = TypeVar("T")


class LLMClient:
    """Blocking facade over `AsyncLLMClient` for scripts and the CLI.

    with LLMClient(ClientConfig(url=...)) as client:
        for event in client.stream("Hello", max_tokens=16):
            print(event.text, end="")
    """

    def __init__(self, config: ClientConfig | None = None, **client_kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="llm-client-loop", daemon=True)
        self._thread.start()
        self._async = self._call(self._make_client(config, client_kwargs))

    @staticmethod
    async def _make_client(config: ClientConfig | None, client_kwargs: dict[str, Any]) -> AsyncLLMClient:
        return AsyncLLMClient(config, **client_kwargs)

    def _call(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    @property
    def async_client(self) -> AsyncLLMClient:
        return self._async

    def stream(
        self,
        text_input: str = "",
        options: GenerationOptions | None = None,
        *,
        model: str | None = None,
        **option_fields: Any,
    ) -> Iterator[StreamEvent]:
        """Yield events; the returned generator's `.result` is not available, so
        use `stream_with_result` when timings are needed."""
        events, _ = self.stream_with_result(text_input, options, model=model, **option_fields)
        return events

    def stream_with_result(
        self,
        text_input: str = "",
        options: GenerationOptions | None = None,
        *,
        model: str | None = None,
        **option_fields: Any,
    ) -> tuple[Iterator[StreamEvent], GenerationResult]:
        stream = self._async.stream(text_input, options, model=model, **option_fields)

        def events() -> Iterator[StreamEvent]:
            try:
                while True:
                    try:
                        yield self._call(stream.__anext__())
                    except StopAsyncIteration:
                        return
            finally:
                # Runs on break / close() too, so an abandoned stream is stopped.
                self._call(stream.aclose())

        return events(), stream.result

    def generate(
        self,
        text_input: str = "",
        options: GenerationOptions | None = None,
        *,
        model: str | None = None,
        **option_fields: Any,
    ) -> GenerationResult:
        return self._call(self._async.generate(text_input, options, model=model, **option_fields))

    def close(self) -> None:
        if self._loop.is_closed():
            return
        try:
            self._call(self._async.aclose())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=5)
            self._loop.close()

    def __enter__(self) -> LLMClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
