"""The block tables of the running decodes, kept in the rows of one
preallocated int32 array (vLLM v1's persistent block table).

Building a [64, width] table from Python lists costs ~70 µs a step here
(NumPy converts ~0.04 µs per element), and gathering rows is one more array
operation (~50-100 µs each on caches the model's weights just flushed). So
each request keeps a row, only what its table grew by is written, and the
decode kernel reads the rows in place through a row index. A row is keyed by the request id and by the identity of the
request's table list (`ScheduledSequence.block_table`, append-only while
the request holds its blocks): a request re-admitted after preemption comes
with a new list and its row is rewritten.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np
import torch

from ..core.scheduler_output import ScheduledSequence


class BlockTableRows:
    def __init__(self, max_blocks_per_seq: int, initial_rows: int = 64) -> None:
        self._array = np.zeros((max(1, initial_rows), max(1, max_blocks_per_seq)), dtype=np.int32)
        # request id -> [row, the table list last seen, entries of it written]
        self._entries: dict[str, list] = {}
        self._free_rows: list[int] = list(range(self._array.shape[0] - 1, -1, -1))
        self._tensor: torch.Tensor | None = None

    @property
    def num_rows_in_use(self) -> int:
        return len(self._entries)

    @property
    def tensor(self) -> torch.Tensor:
        """The whole array [rows, max blocks] as a tensor (shares memory)."""
        if self._tensor is None:
            self._tensor = torch.from_numpy(self._array)
        return self._tensor

    def rows_for(self, seqs: Sequence[ScheduledSequence]) -> list[int]:
        """Each sequence's row, its table brought up to date (padded with block
        0 past its end: never read, the kernel stops at the context length)."""
        entries = self._entries
        rows: list[int] = []
        for seq in seqs:
            table = seq.block_table
            entry = entries.get(seq.request_id)
            if entry is None:
                entry = entries[seq.request_id] = [self._take_row(), table, 0]
            elif entry[1] is not table:
                entry[1], entry[2] = table, 0
            if len(table) != entry[2]:
                self._write(entry, table)
            rows.append(entry[0])
        return rows

    def release(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            entry = self._entries.pop(request_id, None)
            if entry is not None:
                self._free_rows.append(entry[0])

    def _write(self, entry: list, table: list[int]) -> None:
        row, _, written = entry
        n = len(table)
        if n < written:                      # not the append-only table it was: rewrite it
            written = 0
        if n > self._array.shape[1]:
            self._array = np.pad(self._array, ((0, 0), (0, n - self._array.shape[1])))
            self._tensor = None
        if written == 0:
            self._array[row] = 0             # a reused row: no stale ids in the padding
        self._array[row, written:n] = table[written:n]
        entry[2] = n

    def _take_row(self) -> int:
        if not self._free_rows:
            old = self._array.shape[0]
            self._array = np.pad(self._array, ((0, old), (0, 0)))
            self._tensor = None
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        return self._free_rows.pop()
