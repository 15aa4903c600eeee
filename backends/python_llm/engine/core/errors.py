"""Errors the engine raises at intake. Their messages reach clients verbatim,
so each one says what happened in words a client can act on."""

from __future__ import annotations

from contract.errors import OVERLOADED_MARKER

from .sampling_params import InvalidRequestError

__all__ = ["EngineError", "OverloadedError", "DuplicateRequestError", "EngineDeadError", "InvalidRequestError"]


class EngineError(Exception):
    """Base of the engine's own errors (InvalidRequestError stays a ValueError)."""


class OverloadedError(EngineError):
    """The waiting queue is full. Retryable; the message starts with the
    contract's `overloaded:` marker so clients and load tests can spot it."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"{OVERLOADED_MARKER} {detail}")


class DuplicateRequestError(EngineError):
    """A live request already uses this id."""


class EngineDeadError(EngineError):
    """The engine loop failed (or was shut down); no new work is accepted."""
