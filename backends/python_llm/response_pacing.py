"""How often a streaming request gets a response when many stream at once.

Answering a response costs the engine thread its cancel check, building its
tensors and the `send()`, a synchronous round trip to tritonserver
(python_backend's `ResponseSender::Send` waits until the server has taken
it); the ensemble's postprocessing and the gRPC stream then spend CPU on it
too. On the 2-core machines that is ~0.36 ms of the engine thread per
response (0.24 of it the send) plus the other processes' share of the
engine's cores: one response per token and stream costs a 64-stream decode
step about a fifth of its time.

So answering every stream at every step may take at most `share` of the
engine's time: a stream's new tokens are held and sent together until
`streams x answer time / share` seconds (at most `max_hold_s`) have passed
since its last response, the engine thread's time per response measured as
it runs. With few streams that is less than a step and every token goes out
at once; at 64 streams on the 2-core machines a response carries ~2 tokens
(served throughput +20% in paired rounds, docs/benchmarks.md). A first token
and an end are never held. (Sending from a thread of its own instead was
tried: python_backend 2.51's stub crashed in libpython's allocator when it
sent while another thread ran Python.)
"""

from __future__ import annotations

from dataclasses import dataclass

from .engine.core.outputs import RequestOutput
from .running_mean import running_mean


@dataclass
class ResponsePacing:
    """Called on the engine loop thread only."""

    share: float  # 0 = a response at every step, always
    # the longest a token waits for its stream's next response, whatever the
    # answers cost (EngineConfig.stream_max_hold_ms): well inside any
    # client's per-token timeout
    max_hold_s: float
    # running mean of the engine thread's time to answer one response: the
    # cancel check, building its tensors and the send's round trip
    response_seconds: float = 0.0
    # streams with a token in a step, told apart by the step's time (every
    # output of one step carries the same last_token_time_ns)
    _step_ns: int = 0
    _streams_now: int = 0
    _streams_last_step: int = 0

    def record_response(self, seconds: float) -> None:
        self.response_seconds = running_mean(self.response_seconds, seconds)

    def hold_ns(self, out: RequestOutput) -> int:
        """How long after its last response a streaming request's new tokens
        (`out`, of the step being answered) may wait."""
        if out.finished or not out.new_token_ids:
            return 0
        step_ns = out.last_token_time_ns or 0
        if step_ns != self._step_ns:
            self._step_ns, self._streams_last_step, self._streams_now = step_ns, self._streams_now, 0
        self._streams_now += 1
        if self.share <= 0.0:
            return 0
        streams = max(self._streams_now, self._streams_last_step)
        return int(min(self.max_hold_s, streams * self.response_seconds / self.share) * 1e9)
