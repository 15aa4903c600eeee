"""Live requests of the LLM step: who answers them, under which names.

A request has one engine id (the request key minted by `preprocessing`, else
the client's Triton request id, else a fresh uuid) and maybe a client id (the
Triton request id). A `stop` names either. Shared by Triton's execute thread,
the engine loop thread and the cancellation watcher, hence the lock.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from .engine.errors import DuplicateRequestError


@dataclass
class LiveStream:
    engine_id: str
    client_id: str | None
    sender: Any                      # pb_utils.InferenceResponseSender (duck-typed for tests)
    streaming: bool
    prompt_ids: list[int]            # echoed when exclude_input_in_output is false
    exclude_input: bool
    context: bytes = b""             # request_context, echoed on every response
    sent_any: bool = False
    cancel_requested: bool = False
    pending_ids: list[int] = field(default_factory=list)        # non-streaming accumulation
    pending_logprobs: list[float] = field(default_factory=list)
    # Serializes the sender's calls across threads. Once the final response
    # is sent Triton frees the response factory, and `is_cancelled()` on it
    # from the watcher thread then crashes tritonserver (SIGSEGV in
    # TRITONBACKEND_ResponseFactoryIsCancelled, seen at 64 concurrent streams).
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    closed: bool = False             # the final response was sent; never touch the sender again

    def send(self, response: Any, flags: int, final: bool) -> None:
        with self.lock:
            if self.closed:
                return
            if final:
                self.closed = True
            self.sent_any = True
            self.sender.send(response, flags=flags)


class StreamRegistry:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_engine_id: dict[str, LiveStream] = {}
        self._by_client_id: dict[str, str] = {}

    def register(self, stream: LiveStream) -> None:
        with self._lock:
            if stream.engine_id in self._by_engine_id:
                raise DuplicateRequestError(f"request id: {stream.engine_id!r} is already running")
            if stream.client_id is not None and stream.client_id in self._by_client_id:
                raise DuplicateRequestError(f"request id: {stream.client_id!r} is already running")
            self._by_engine_id[stream.engine_id] = stream
            if stream.client_id is not None:
                self._by_client_id[stream.client_id] = stream.engine_id

    def get(self, engine_id: str) -> LiveStream | None:
        with self._lock:
            return self._by_engine_id.get(engine_id)

    def resolve(self, name: str) -> str | None:
        """Engine id for a client id or an engine id; None when unknown."""
        with self._lock:
            if name in self._by_engine_id:
                return name
            return self._by_client_id.get(name)

    def remove(self, engine_id: str) -> LiveStream | None:
        with self._lock:
            stream = self._by_engine_id.pop(engine_id, None)
            if stream is not None and stream.client_id is not None:
                self._by_client_id.pop(stream.client_id, None)
            return stream

    @staticmethod
    def is_newly_cancelled(stream: LiveStream) -> bool:
        """True once, when the stream's client has gone away."""
        with stream.lock:
            if stream.closed or stream.cancel_requested or not stream.sender.is_cancelled():
                return False
            stream.cancel_requested = True
            return True

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_engine_id)
