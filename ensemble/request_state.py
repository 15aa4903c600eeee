"""Per-request state kept between calls (e.g. an OutputPipeline between the
postprocessing calls of one stream), keyed by the request key.

Entries are stale when untouched for ``ttl_s``: a request whose final call
never came (client gone, engine error) must not leak its state.
"""
from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class _Entry(Generic[T]):
    state: T
    created: float
    touched: float


class RequestStateStore(Generic[T]):
    """Thread-safe; entries are kept in least-recently-used order, so eviction
    looks only at the entries it removes."""

    def __init__(self, ttl_s: float = 600.0, max_entries: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be > 0, got {ttl_s}")
        if max_entries < 1:
            raise ValueError(f"max_entries must be >= 1, got {max_entries}")
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, _Entry[T]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def get_or_create(self, key: str, factory: Callable[[], T]) -> T:
        now = self._clock()
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._evict_locked(now, room=1)
                entry = _Entry(factory(), created=now, touched=now)
                self._entries[key] = entry
            else:
                entry.touched = now
                self._entries.move_to_end(key)
            return entry.state

    def get(self, key: str) -> T | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            entry.touched = self._clock()
            self._entries.move_to_end(key)
            return entry.state

    def pop(self, key: str) -> T | None:
        with self._lock:
            entry = self._entries.pop(key, None)
            return None if entry is None else entry.state

    def age_s(self, key: str) -> float | None:
        """Seconds since the entry was created (None if absent)."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else self._clock() - entry.created

    def evict_stale(self) -> list[str]:
        """Remove entries untouched for ttl_s; returns their keys."""
        with self._lock:
            return self._evict_locked(self._clock(), room=0)

    def _evict_locked(self, now: float, room: int) -> list[str]:
        evicted = []
        while self._entries:
            key, entry = next(iter(self._entries.items()))
            stale = now - entry.touched >= self.ttl_s
            if not stale and len(self._entries) + room <= self.max_entries:
                break
            del self._entries[key]
            evicted.append(key)
            if not stale:
                log.warning("request state store full; evicted the least recently used entry",
                            extra={"max_entries": self.max_entries})
        if evicted:
            log.info("evicted request states", extra={"count": len(evicted)})
        return evicted
