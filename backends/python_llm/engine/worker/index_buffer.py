"""One persistent CPU tensor that holds a step's int64 index arrays (token
ids, positions, slots, sampled rows, ...), and views of it that are reused
while the step's shape repeats.

Between two steps the model streams all its weights through the caches, so
every torch call of a step's bookkeeping runs cold: about 65 µs each for
`frombuffer`, `split` or `unbind` here, against a few µs warm. A decode step
usually has the shape of the one before it (the same number of sequences),
so this copies the new values into the same memory (one `memmove`) and hands
back the same views: no torch call at all.
"""

from __future__ import annotations

import array
import ctypes

import torch


class IndexBuffer:
    def __init__(self, capacity: int = 1024) -> None:
        self._tensor = torch.empty(max(1, capacity), dtype=torch.int64)
        self._address = self._tensor.data_ptr()
        self._sizes: tuple[int, ...] = ()
        self._views: tuple[torch.Tensor, ...] = ()

    def load(self, values: array.array[int], sizes: tuple[int, ...]) -> tuple[torch.Tensor, ...]:
        """Views of `values` ('q' array), cut into consecutive parts of
        `sizes`. The views stay valid until the next `load`, which overwrites
        them: one step's tensors at a time."""
        total = len(values)
        if sum(sizes) != total:
            raise ValueError(f"index buffer: sizes {sizes} do not add up to {total} values")
        if total > self._tensor.numel():
            self._tensor = torch.empty(2 * total, dtype=torch.int64)
            self._address = self._tensor.data_ptr()
            self._sizes = ()
        if total:
            ctypes.memmove(self._address, values.buffer_info()[0], total * values.itemsize)
        if sizes != self._sizes:
            self._views = torch.split(self._tensor[:total], list(sizes))
            self._sizes = sizes
        return self._views
