"""Streaming client library for the Triton LLM stack (SSE and gRPC), to Triton
directly or through the gateway (`ClientConfig.api_key`; see client/config.py,
client/resume.py)."""

from .client import AsyncLLMClient
from .config import ClientConfig, RetryConfig, TimeoutConfig
from .errors import (
    ClientError,
    ClientTimeoutError,
    FirstTokenTimeoutError,
    RequestError,
    ServerConnectionError,
    StreamResumeError,
    TokenTimeoutError,
)
from .retry import RetryBudget
from .stream import GenerationStream
from .sync import LLMClient
from .timing import Timings, compute_tpot
from .types import GenerationOptions, GenerationResult, StreamEvent

__all__ = [
    "AsyncLLMClient",
    "LLMClient",
    "ClientConfig",
    "RetryConfig",
    "TimeoutConfig",
    "RetryBudget",
    "GenerationOptions",
    "GenerationResult",
    "GenerationStream",
    "StreamEvent",
    "Timings",
    "compute_tpot",
    "ClientError",
    "ClientTimeoutError",
    "FirstTokenTimeoutError",
    "RequestError",
    "ServerConnectionError",
    "StreamResumeError",
    "TokenTimeoutError",
]
