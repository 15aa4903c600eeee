"""Per-request stream state shared by every `postprocessing` instance.

Why: with `instance_group count > 1`, Triton hands consecutive responses of one
stream to different instances, which are separate stub processes. The
detokenizer, stop-string and filter state of a stream must move with it, and
delta k+1 must not be processed before delta k (tensorrtllm_backend #614).

How: each delta carries its position (`sequence_length` = tokens generated so
far, so the delta starts at sequence_length - len(delta)). An instance loads
the stream's state only once the state says "next position = my start", runs
the stage, and stores the new state. The store is one SQLite file in shared
memory (atomic, cross-process, no server to run); `dynamic_batching {
preserve_ordering: true }` then releases the responses in arrival order.
A single instance keeps state in process (`InProcessStateStore`) and skips all
of this.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Protocol


class StreamOrderError(RuntimeError):
    """The previous delta of a stream never arrived within the wait bound."""


class StateStore(Protocol):
    def load(self, key: str, start: int, timeout_s: float) -> bytes | None: ...
    def save(self, key: str, next_start: int, blob: bytes) -> None: ...
    def delete(self, key: str) -> None: ...


class InProcessStateStore:
    """One instance: deltas of a stream arrive here in order already."""

    def __init__(self) -> None:
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def load(self, key: str, start: int, timeout_s: float) -> bytes | None:
        with self._lock:
            return self._blobs.get(key)

    def save(self, key: str, next_start: int, blob: bytes) -> None:
        with self._lock:
            self._blobs[key] = blob

    def delete(self, key: str) -> None:
        with self._lock:
            self._blobs.pop(key, None)


class SqliteStateStore:
    POLL_S = 0.0005
    OPEN_TIMEOUT_S = 30.0

    def __init__(self, path: str) -> None:
        self._conn = sqlite3.connect(path, timeout=self.OPEN_TIMEOUT_S, isolation_level=None, check_same_thread=False)
        self._lock = threading.Lock()
        # The instances start together. Switching a new file to WAL while
        # another connection does the same is answered "database is locked"
        # at once, without the busy timeout (3 processes opening one new file:
        # 25 failures in 60 tries); once the other is done it succeeds.
        deadline = time.monotonic() + self.OPEN_TIMEOUT_S
        while True:
            try:
                with self._lock:
                    self._conn.execute("PRAGMA journal_mode=WAL")
                    self._conn.execute("PRAGMA synchronous=OFF")
                    self._conn.execute(
                        "CREATE TABLE IF NOT EXISTS stream_state (key TEXT PRIMARY KEY, next_start INTEGER, blob BLOB)"
                    )
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.01)

    def load(self, key: str, start: int, timeout_s: float) -> bytes | None:
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                row = self._conn.execute("SELECT next_start, blob FROM stream_state WHERE key = ?", (key,)).fetchone()
            if row is None and start == 0:
                return None
            if row is not None and row[0] == start:
                return row[1]
            if time.monotonic() > deadline:
                have = None if row is None else row[0]
                # the key is the request's secret: never in a message that may be logged
                raise StreamOrderError(
                    f"stream state: waited {timeout_s} s for position {start}, the stream is at {have}"
                )
            time.sleep(self.POLL_S)

    def save(self, key: str, next_start: int, blob: bytes) -> None:
        with self._lock:
            # columns named: a file left in /dev/shm by an earlier version has a
            # fourth column (`updated`), which then stays NULL
            self._conn.execute(
                "INSERT OR REPLACE INTO stream_state (key, next_start, blob) VALUES (?, ?, ?)", (key, next_start, blob)
            )

    def delete(self, key: str) -> None:
        with self._lock:
            self._conn.execute("DELETE FROM stream_state WHERE key = ?", (key,))
