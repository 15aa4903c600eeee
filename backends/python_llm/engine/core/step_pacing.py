"""One step's prefill pacing, for the scheduler: the units the step may
spend on prompt chunks (`prefill_pacer.py`), what its chunks spent, its
layer slice (`layer_slices.py`), and the step's time fed back once it ran.

`begin()` when the step's decodes are known, `chunk()` / `charge()` for each
prompt chunk, `sent()` when the step leaves the scheduler, `observe()` with
the runner's result. Between `sent()` and the next `begin()`, `layer_slice`
is the slice of the step in flight.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from .layer_slices import LayerSlicer
from .prefill_pacer import PrefillPacer
from .request import Request
from .scheduler_output import LayerSlice, RunnerOutput


class StepPacing:
    def __init__(self, pacer: PrefillPacer, slicer: LayerSlicer, max_num_batched_tokens: int) -> None:
        self.pacer = pacer
        self.slicer = slicer
        self.max_num_batched_tokens = max_num_batched_tokens
        self.clock: Callable[[], float] = time.perf_counter
        self.num_decodes = 0
        self.units = 0.0  # spent by this step's chunks
        self._planned = False  # the step's budget was asked for (a long prompt's chunk)
        self._budget: float | None = None  # its units; None: no limit
        self._aim_s: float | None = None  # the step's planned seconds, where paced
        self.layer_slice: LayerSlice | None = None
        self.num_chunks = 0  # charged this step, the slice's included
        self.num_unpaced = 0  # of them, short prompts' (pacing does not cut those)
        self.at_floor = False  # a chunk or slice ran past the plan: the least progress allowed
        self._sent_at = 0.0

    def begin(self, num_decodes: int) -> None:
        self.num_decodes = num_decodes
        self.units = 0.0
        self._planned = False
        self._budget = self._aim_s = None
        self.layer_slice = None
        self.num_chunks = self.num_unpaced = 0
        self.at_floor = False

    @property
    def units_left(self) -> float | None:
        """Pacing units the step may still spend; None: no limit. Planned on
        first use, by a long prompt's chunk: most steps have none to pace."""
        if not self._planned:
            self._planned = True
            if self.pacer.enabled:
                self._budget, self._aim_s = self.pacer.plan(self.num_decodes)
        return None if self._budget is None else self._budget - self.units

    def chunk(self, req: Request, start: int, available: int, scheduled_any: bool) -> tuple[LayerSlice | None, int]:
        """A running prefill's chunk this step, of at most `available` tokens
        from `start`: (its layer slice, the chunk's tokens) or (None, tokens
        through all layers); 0 tokens: paced out of this step."""
        if self._long(req):  # a chunk in slices is a long prompt's too
            layer_slice, tokens = self.slicer.next_slice(
                req, start, available, self.units_left, self.num_decodes, self.units
            )
            if layer_slice is not None:
                self.at_floor |= self.slicer.at_floor
                return layer_slice, tokens
        return None, self.paced(req, start, available, scheduled_any)

    def _long(self, req: Request) -> bool:
        """Only long prompts (more tokens than a step's budget) are paced."""
        return req.num_tokens > self.max_num_batched_tokens

    def paced(self, req: Request, start: int, num_new: int, scheduled_any: bool) -> int:
        """`num_new` cut to what pacing allows for this request's chunk from
        `start` (a long prompt's), the step's first prefill at least
        MIN_CHUNK tokens."""
        if not self._long(req):
            return num_new
        units = self.units_left
        if units is None:
            return num_new
        allowed = self.pacer.max_tokens(start, max(units, 0.0))
        if not scheduled_any and allowed < min(num_new, self.pacer.min_tokens):
            allowed = self.pacer.min_tokens
            self.at_floor = True
        return min(num_new, allowed)

    def charge(self, req: Request, start: int, num_new: int, layer_slice: LayerSlice | None = None) -> bool:
        """A chunk is in the step: spend its units (a slice: its layers'
        share). True when the runner samples it (it ends the request's
        tokens, after its last layer)."""
        share = 1.0
        if layer_slice is not None:
            layers = self.slicer.num_layers
            self.slicer.scheduled(req, layer_slice, num_new)
            self.layer_slice = layer_slice
            share = (layer_slice.end_layer - layer_slice.first_layer) / layers
        self.units += self.pacer.cost(start, num_new) * share
        self.num_chunks += 1
        self.num_unpaced += not self._long(req)
        if layer_slice is None:
            return start + num_new == req.num_tokens
        return layer_slice.end_layer == self.slicer.num_layers and start + num_new == req.num_tokens

    def sent(self) -> None:
        self._sent_at = self.clock()

    def observe(self, runner_output: RunnerOutput, requests: dict[str, Request]) -> None:
        """The step ran: its time teaches the pacer, and the slicer when the
        step's only prefill was its slice."""
        if not self.pacer.enabled:
            return
        step_s = self.clock() - self._sent_at
        self.pacer.observe(
            step_s, self.num_decodes, self.units, None if self.num_unpaced or self.at_floor else self._aim_s
        )
        layer_slice = self.layer_slice
        if layer_slice is None or self.num_chunks != 1:
            return
        req = requests.get(layer_slice.request_id)
        if req is not None:
            self.slicer.observe(req, layer_slice, step_s, runner_output.slice_seconds)
