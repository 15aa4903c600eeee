"""Exceptions raised by the client library.

The split that matters to callers: `RequestError` means the server refused the
request before any data (nothing was generated, the caller may fix and resend);
`ClientTimeoutError` subclasses mean the client gave up waiting.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from contract.errors import OVERLOADED_MARKER

if TYPE_CHECKING:
    from .types import GenerationResult

# HTTP statuses a proxy or gateway uses for "come back later".
RETRYABLE_STATUSES = frozenset({429, 503})


class ClientError(Exception):
    """Base class of everything this library raises on purpose."""


class RequestError(ClientError):
    """The server rejected the request before streaming any data."""

    def __init__(self, message: str, status: int | None = None, retry_after_s: float | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}" if status is not None else message)
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        return OVERLOADED_MARKER in self.message or self.status in RETRYABLE_STATUSES


class ServerConnectionError(ClientError):
    """The server could not be reached (refused, reset, DNS): always retryable."""


class StreamResumeError(ServerConnectionError):
    """A dropped stream could not be resumed through the gateway (refused with
    404 / 410, or every reconnection failed); the message says which."""


class ClientTimeoutError(ClientError):
    """The client stopped waiting; `result` holds whatever arrived before."""

    def __init__(self, message: str, result: GenerationResult | None = None) -> None:
        super().__init__(message)
        self.result = result


class FirstTokenTimeoutError(ClientTimeoutError):
    """No response arrived within the first-token timeout."""


class TokenTimeoutError(ClientTimeoutError):
    """The gap between two streamed responses exceeded the per-token timeout."""


def is_retryable(exc: BaseException) -> bool:
    """Errors that are safe to retry because nothing has been generated yet."""
    if isinstance(exc, ServerConnectionError):
        return True
    return isinstance(exc, RequestError) and exc.retryable
