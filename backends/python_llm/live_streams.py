"""Live requests of the LLM step: who answers them, under which names.

A request has an engine id (minted here, never shown), a request key (the
caller's secret, see `contract/request_key.py`) and maybe a client id (the
Triton request id, which only names it in logs). A `stop` must name the key:
request ids are chosen by clients and guessable. Shared by Triton's execute
thread (register, stop) and the engine loop thread (outputs), hence the lock.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from .engine.core.errors import DuplicateRequestError
from .running_mean import running_mean
from .stream_assembly import StreamAssembly

# How often a running stream asks whether its client went away. The answer
# is a round trip to tritonserver (python_backend's PbCancel::IsCancelled),
# ~0.175 ms of the engine thread on the 2-core machines, which per step and
# stream cost more than sending the token (a served run's profile at 64
# streams). So all the streams' checks together may take CANCEL_CHECK_SHARE
# of the caller's time: a stream asks every `live streams x check time /
# share` seconds, the check's time measured as it runs, but at least every
# CANCEL_CHECK_MAX_INTERVAL_S and at most every CANCEL_CHECK_INTERVAL_S. At
# 64 streams that is ~1.1 s: with 0.25 s a stream asked every other ~190 ms
# step, ~3% of the engine thread, now ~1%. A cancel is noticed within the
# interval, then the request stops at its next step. (Requests from the
# ensemble or llm_bls are never marked cancelled by Triton 2.51: they are
# stopped by key at once.)
CANCEL_CHECK_INTERVAL_S = 0.25
CANCEL_CHECK_MAX_INTERVAL_S = 2.0
CANCEL_CHECK_SHARE = 0.01


@dataclass
class LiveStream:
    engine_id: str
    key: str
    client_id: str | None
    sender: Any  # pb_utils.InferenceResponseSender (duck-typed for tests)
    assembly: StreamAssembly  # which responses the engine's outputs call for
    context: bytes = b""  # request_context, echoed on every response
    # the outputs the caller asked for: the only ones its responses may carry
    # (ensemble/requested_outputs.py says why)
    requested_outputs: frozenset[str] = field(kw_only=True)
    cancel_requested: bool = False
    next_cancel_check: float = 0.0  # time.monotonic() of the next is_cancelled() round trip
    # Guards `closed` and the sender: the execute thread sends a rejection,
    # the engine loop thread everything else. Once the final response is sent
    # Triton frees the response factory, and `is_cancelled()` on it then
    # crashes tritonserver (SIGSEGV in TRITONBACKEND_ResponseFactoryIsCancelled,
    # seen at 64 concurrent streams).
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    closed: bool = False  # the final response was sent; never touch the sender again

    def send(self, response: Any, flags: int, final: bool) -> None:
        with self.lock:
            if self.closed:
                return
            if final:
                self.closed = True
            self.sender.send(response, flags=flags)


class LiveStreamTable:
    """The live streams of one Triton model instance (their response senders),
    by engine id, request key and client id."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_engine_id: dict[str, LiveStream] = {}
        self._by_client_id: dict[str, str] = {}
        self._by_key: dict[str, str] = {}
        self.cancel_check_seconds = 0.0  # running mean of one is_cancelled() round trip

    def register(self, stream: LiveStream) -> None:
        with self._lock:
            if stream.engine_id in self._by_engine_id:
                raise DuplicateRequestError(f"request id: engine id {stream.engine_id!r} is already running")
            if stream.client_id is not None and stream.client_id in self._by_client_id:
                raise DuplicateRequestError(f"request id: {stream.client_id!r} is already running")
            if stream.key in self._by_key:  # never echo a key in an error
                raise DuplicateRequestError("request_key: already used by a live request")
            self._by_engine_id[stream.engine_id] = stream
            self._by_key[stream.key] = stream.engine_id
            if stream.client_id is not None:
                self._by_client_id[stream.client_id] = stream.engine_id

    def get(self, engine_id: str) -> LiveStream | None:
        with self._lock:
            return self._by_engine_id.get(engine_id)

    def engine_id_for_key(self, key: str) -> str | None:
        """The live request this key belongs to; None when none does."""
        with self._lock:
            return self._by_key.get(key)

    def remove(self, engine_id: str) -> LiveStream | None:
        with self._lock:
            stream = self._by_engine_id.pop(engine_id, None)
            if stream is not None:
                self._by_key.pop(stream.key, None)
                if stream.client_id is not None:
                    self._by_client_id.pop(stream.client_id, None)
            return stream

    def end_failed(self, engine_id: str, error_response: Any, final_flag: int) -> bool:
        """Answering the request failed: it leaves the registry and its client
        gets `error_response` as its final answer (unless one went out), not a
        wait for a final that never comes. True when the error was sent."""
        stream = self.remove(engine_id)
        if stream is None or stream.closed:
            return False
        try:
            stream.send(error_response, final_flag, final=True)
        except Exception:  # the sender is what failed: the client is gone
            return False
        return True

    def cancel_check_interval(self) -> float:
        """Seconds between a stream's cancel checks now (see CANCEL_CHECK_SHARE)."""
        with self._lock:
            budgeted = len(self._by_engine_id) * self.cancel_check_seconds / CANCEL_CHECK_SHARE
        return min(CANCEL_CHECK_MAX_INTERVAL_S, max(CANCEL_CHECK_INTERVAL_S, budgeted))

    def is_newly_cancelled(self, stream: LiveStream, now: float | None = None) -> bool:
        """True once, when the stream's client has gone away; asks the sender
        at most every cancel_check_interval() (the first call always asks)."""
        now = time.monotonic() if now is None else now
        with stream.lock:
            if stream.closed or stream.cancel_requested or now < stream.next_cancel_check:
                return False
            started = time.perf_counter()
            cancelled = stream.sender.is_cancelled()
            self._record_check(time.perf_counter() - started)
            stream.next_cancel_check = now + self.cancel_check_interval()
            if not cancelled:
                return False
            stream.cancel_requested = True
            return True

    def _record_check(self, seconds: float) -> None:
        with self._lock:  # the tensorrt_llm adapter checks from several threads
            self.cancel_check_seconds = running_mean(self.cancel_check_seconds, seconds)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_engine_id)
