"""Client settings: timeouts shaped for LLM streams, the retry and resume policy,
and the API key that sends the client through the gateway.

    # Triton directly (loopback): no key; cancel = `stop` to python_llm with the request key
    ClientConfig(url="http://127.0.0.1:8000")
    # the gateway: Bearer key on every request; a dropped SSE stream is resumed
    # (GET /v1/streams/{id} + Last-Event-ID), cancel = DELETE /v1/streams/{id}
    ClientConfig(url="http://127.0.0.1:9000", api_key=os.environ["LLM_API_KEY"])
    ClientConfig(url="127.0.0.1:9001", transport="grpc", api_key=...)   # cancel = the RPC's cancel
"""

from __future__ import annotations

from dataclasses import dataclass, field

TRANSPORTS = ("sse", "grpc")
# Public entry points (interface.md); `ensemble` needs an explicit stop on
# cancel because Triton does not tell a running ensemble step that the client left.
ENTRY_MODELS = ("ensemble", "llm_bls")


@dataclass(frozen=True)
class TimeoutConfig:
    """No overall deadline on purpose: a long answer is not a slow answer.

    connect_s bounds opening a connection, first_token_s the wait for the first
    response (queueing + prefill), token_s every later gap between responses.
    None disables the first-token or per-token limit.
    """

    connect_s: float = 5.0
    first_token_s: float | None = 120.0
    token_s: float | None = 30.0
    write_s: float = 10.0
    stop_s: float = 5.0  # sending the `stop` request for a cancelled ensemble stream
    # gRPC: the longest wait between attempts to reconnect a lost channel.
    # gRPC's own grows to 120 s, and while it waits every call fails at once: a
    # replica restarted in ~10 s stayed "not ready" to the gateway's probes for
    # up to ~11 s after it was up (docs/benchmarks.md, "Kept: a lost channel
    # retried at least every second").
    reconnect_max_s: float = 1.0

    def __post_init__(self) -> None:
        for name in ("connect_s", "write_s", "stop_s", "first_token_s", "token_s", "reconnect_max_s"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be > 0 (got {value})")


@dataclass(frozen=True)
class RetryConfig:
    """Exponential backoff with full jitter, plus a client-wide retry budget.

    The budget allows at most `budget_ratio` retries per request over time plus
    `budget_floor` spare ones, capped at `budget_cap` banked retries, so a fleet
    of clients facing an overloaded server backs off instead of multiplying load.
    """

    max_attempts: int = 4
    backoff_base_s: float = 0.2
    backoff_max_s: float = 10.0
    max_retry_after_s: float = 60.0
    budget_ratio: float = 0.2
    budget_floor: float = 10.0
    budget_cap: float = 100.0
    # Resuming a dropped SSE stream through the gateway (client/resume.py): up to
    # `resume_attempts` reconnections per drop (0: no resume), full-jitter backoff
    # from `backoff_base_s` up to `resume_backoff_max_s`. Kept well inside the
    # gateway's grace period (~10 s), after which the stream is stopped anyway.
    # Resumes do not spend the retry budget: they replay a generation that is
    # already running instead of adding one.
    resume_attempts: int = 3
    resume_backoff_max_s: float = 2.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1 (got {self.max_attempts})")
        if self.backoff_base_s < 0 or self.backoff_max_s < self.backoff_base_s:
            raise ValueError("need 0 <= backoff_base_s <= backoff_max_s")
        if not 0 <= self.budget_ratio <= 1:
            raise ValueError(f"budget_ratio must be in [0, 1] (got {self.budget_ratio})")
        if self.budget_floor < 0 or self.budget_cap < self.budget_floor:
            raise ValueError("need 0 <= budget_floor <= budget_cap")
        if self.max_retry_after_s < 0:
            raise ValueError("max_retry_after_s must be >= 0")
        if self.resume_attempts < 0:
            raise ValueError(f"resume_attempts must be >= 0 (got {self.resume_attempts})")
        if self.resume_backoff_max_s < 0:
            raise ValueError(f"resume_backoff_max_s must be >= 0 (got {self.resume_backoff_max_s})")


@dataclass(frozen=True)
class ClientConfig:
    url: str = "http://127.0.0.1:8000"
    transport: str = "sse"
    model: str = "ensemble"
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    retry: RetryConfig = field(default_factory=RetryConfig)
    max_connections: int = 256
    # The LLM step that accepts `stop` for a request key (interface.md, "Request identity").
    stop_model: str = "python_llm"
    # The gateway's API key (`Authorization: Bearer`, gRPC metadata alike). Set =
    # "through the gateway": cancel is the gateway's (DELETE /v1/streams/{id}, or
    # the RPC cancel), never the python_llm stop, which the gateway does not expose.
    # A secret: not in repr().
    api_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {TRANSPORTS} (got {self.transport!r})")
        if not self.model:
            raise ValueError("model must not be empty")
        if self.max_connections < 1:
            raise ValueError("max_connections must be >= 1")
        if not self.url:
            raise ValueError("url must not be empty")
        if self.api_key is not None and (not self.api_key or any(c.isspace() for c in self.api_key)):
            # The message never repeats the value: errors end up in logs.
            raise ValueError("api_key must be a non-empty token without whitespace")

    @property
    def through_gateway(self) -> bool:
        return self.api_key is not None

    @property
    def sends_stop_on_cancel(self) -> bool:
        # llm_bls and the LLM step itself see the disconnect; an ensemble does
        # not pass it on, so it gets an explicit stop to free the KV blocks.
        # Through the gateway the stop model is unreachable: it cancels instead.
        return not self.through_gateway and self.model not in ("llm_bls", self.stop_model)
