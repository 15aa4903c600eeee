"""Decoupled BLS calls whose responses carry tensors, made safe on the Python
backend stub of Triton 2.51 (python_backend r24.10).

Why this exists: the stub keeps each decoupled BLS call's response iterator
in a map of its own as well as in the Python object `exec()` returned. Once
the final response is read, the iterator queues a clean-up that the stub's
stub-to-parent thread runs later: it erases the map entry *without the GIL*
(`Stub::SendCleanupId`). When that erase drops the last reference, the
iterator's responses are destroyed on that thread, and with them the numpy
array of every output tensor (`PbTensor::~PbTensor` takes the GIL only from
r24.12, python_backend commit b771f4f). Freed while another thread runs
Python, they corrupt the interpreter's heap and the stub dies with SIGSEGV
(seen in CI as "Stub process 'tensorrt_llm_0_0' is not healthy"; with only
ensemble/requested_outputs.py's fix, tests/e2e/soak_trtllm_stubs.py still
killed the thin step's stub in 4 runs of 5).

So Python must drop the last reference, with the GIL held, after the stub's
clean-up has run. The stub-to-parent thread serves one FIFO queue, and an
`is_cancelled()` that answers False made a round trip through it. So a
finished iterator is retired here, and released by the first such round trip
that began after it was retired (`cancelled_with_release`).

Calls whose responses carry no tensors (the `stop` calls) free nothing of
Python's and need none of this.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any


class RetiredResponses:
    """Finished response iterators, held until the stub has cleaned them up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: list[tuple[int, Any]] = []
        self._retired = 0

    def retire(self, iterator: Any) -> None:
        with self._lock:
            self._held.append((self._retired, iterator))
            self._retired += 1

    def mark(self) -> int:
        """How many were retired so far: their clean-ups are already queued."""
        with self._lock:
            return self._retired

    def release_before(self, mark: int) -> None:
        with self._lock:
            released = [it for number, it in self._held if number < mark]
            self._held = [(number, it) for number, it in self._held if number >= mark]
        del released  # the last references, dropped here with the GIL and outside the lock

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


def decoupled_responses(request: Any, retired: RetiredResponses) -> Iterator[Any]:
    """`request.exec(decoupled=True)`'s responses; the iterator is retired when
    the caller is done with it (at its end, on an early break, on an error)."""
    responses = request.exec(decoupled=True)
    try:
        yield from responses
    finally:
        retired.retire(responses)


def cancelled_with_release(sender: Any, retired: RetiredResponses) -> bool:
    """`sender.is_cancelled()`, releasing what was retired before it when the
    answer came from a round trip. Call it only before the request's final
    response: after it, Triton has freed the response factory that
    `is_cancelled()` reads. A True may be the stub's cached answer, so it
    releases nothing. The callers ask each sender from one thread at a time,
    so a False is this call's own round trip, not another one's answer."""
    mark = retired.mark()
    cancelled = bool(sender.is_cancelled())
    if not cancelled:
        retired.release_before(mark)
    return cancelled
