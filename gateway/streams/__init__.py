"""Resumable streams: numbered SSE events in a bounded buffer, a grace
period for dropped connections, resume and cancel by stream id (optionally
through any gateway process, via Redis), keep-alive comments."""

from .registry import StreamRegistry
from .serve import serve_resumable

__all__ = ["StreamRegistry", "serve_resumable"]
