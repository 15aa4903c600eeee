"""The block tables of the requests the runner holds, kept in the rows of one
preallocated int32 array (vLLM v1's persistent block table).

Building a [64, width] table from Python lists costs ~70 µs a step here
(NumPy converts ~0.04 µs per element), and gathering rows is one more array
operation (~50-100 µs each on caches the model's weights just flushed). So
each request owns a row from admission to finish or preemption, only the
blocks the scheduler adds are written, and the decode kernel reads the rows
in place through a row index. Which request owns which row is the
InputBatch's business (`input_batch.py`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


class BlockTableRows:
    def __init__(self, max_blocks_per_seq: int, initial_rows: int = 64) -> None:
        self._array = np.zeros((max(1, initial_rows), max(1, max_blocks_per_seq)), dtype=np.int32)
        self._free_rows: list[int] = list(range(self._array.shape[0] - 1, -1, -1))
        self._tensor: torch.Tensor | None = None

    @property
    def num_rows_in_use(self) -> int:
        return self._array.shape[0] - len(self._free_rows)

    @property
    def tensor(self) -> torch.Tensor:
        """The whole array [rows, max blocks] as a tensor (shares memory)."""
        if self._tensor is None:
            self._tensor = torch.from_numpy(self._array)
        return self._tensor

    def add(self, block_ids: Sequence[int]) -> int:
        """A free row holding `block_ids`, padded with block 0 (never read:
        the kernel stops at the context length)."""
        if not self._free_rows:
            old = self._array.shape[0]
            self._array = np.pad(self._array, ((0, old), (0, 0)))
            self._tensor = None
            self._free_rows = list(range(2 * old - 1, old - 1, -1))
        row = self._free_rows.pop()
        self._array[row] = 0  # a reused row: no stale ids in the padding
        self.write(row, 0, block_ids)
        return row

    def write(self, row: int, start: int, block_ids: Sequence[int]) -> None:
        """`block_ids` into `row` from column `start` on."""
        end = start + len(block_ids)
        if end > self._array.shape[1]:
            self._array = np.pad(self._array, ((0, 0), (0, end - self._array.shape[1])))
            self._tensor = None
        if block_ids:
            self._array[row, start:end] = block_ids

    def free(self, row: int) -> None:
        self._free_rows.append(row)
